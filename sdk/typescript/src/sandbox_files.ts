/**
 * `SandboxOperations`' files, git and environment (sandbox.ts has the class).
 *
 * @module
 */

import { readBody, parseError } from './client.js';
import {
  createErrorFromResponse,
  SandboxError,
  ValidationFailedError,
} from './errors.js';
import { EventStream } from './stream.js';
import type {
  CheckChangesOptions,
  CheckChangesResult,
  FileEncoding,
  FileStreamEvent,
  FileWatchEvent,
  GitCheckoutOptions,
  GitCheckoutResult,
  ListFilesResult,
  ReadFileResult,
  WatchOptions,
  WriteFileResult,
} from './types.js';
import { EventIterable, sessionOf, shq, type SessionArg } from './sandbox_core.js';
import { SandboxProcesses } from './sandbox_processes.js';

/** A link of {@link SandboxOperations}: files, git, environment (not exported by the package). */
export class SandboxFiles extends SandboxProcesses {
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

  /**
   * Has a directory changed since `options.since`? The polling alternative
   * to {@link watch} (the Cloudflare SDK's `checkChanges`): the first call
   * keeps a change state in the container and answers `unchanged` with a
   * `version`; pass that as `since` next time to get `unchanged` or
   * `changed` (and the new version), or `resync` (`reason` `expired` or
   * `restarted`) when that state is gone — then read what you need again.
   * Each call counts as activity (it keeps the sandbox awake).
   *
   * @throws {@link ValidationFailedError} for a malformed `since` or one ahead of the state;
   *   {@link FileNotFoundError}; {@link WatchStartError}.
   */
  checkChanges(path: string, options: CheckChangesOptions = {}): Promise<CheckChangesResult> {
    const args: Record<string, unknown> = { path };
    if (options.since !== undefined) args.since = options.since;
    if (options.recursive !== undefined) args.recursive = options.recursive;
    if (options.include) args.include = options.include;
    if (options.exclude) args.exclude = options.exclude;
    const sid = this.session(options.sessionId);
    if (sid !== undefined) args.sessionId = sid;
    return this.call<CheckChangesResult>('file.checkChanges', args);
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
}
