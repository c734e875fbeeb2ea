/**
 * The HTTP client: connection settings, authentication, idempotency keys,
 * retries and error mapping. Every other part of the SDK talks to the
 * server through an {@link SbxClient}.
 *
 * @module
 */

import { randomUUID } from 'node:crypto';
import http from 'node:http';
import https from 'node:https';

import {
  createErrorFromResponse,
  GatewayUnavailableError,
  RequestTimeoutError,
  SandboxError,
  type ErrorResponse,
} from './errors.js';

/** How failed requests are retried. */
export interface RetryOptions {
  /** Retries after the first attempt (default 4; 0 disables retrying). */
  retries?: number;
  /** First back-off delay in ms (default 100); doubled after every retry. */
  minDelayMs?: number;
  /** Cap of the back-off delay in ms (default 3000). */
  maxDelayMs?: number;
}

/** Options of {@link SbxClient}. */
export interface SbxClientOptions {
  /**
   * Base URL of the sbx HTTP API, e.g. `http://127.0.0.1:7780`.
   * Default: `process.env.SBX_URL`, else `http://127.0.0.1:7780`.
   */
  url?: string;
  /**
   * API key, sent as `Authorization: Bearer <key>`. Default:
   * `process.env.SBX_API_KEY` (none when unset: a loopback daemon without
   * `--api-keys` needs none).
   */
  apiKey?: string;
  /** Retry policy for network errors and `503 SHARD_UNAVAILABLE` (see {@link RetryOptions}); `false` disables retries. */
  retry?: RetryOptions | false;
  /**
   * Client-side deadline of one call, in ms (default 630 000: the gateway's
   * 10-minute deadline plus a margin), retries and their back-off included:
   * a call settles by it (+ at most 1 s of slack for the event loop)
   * whatever the server does — never answering, stopped, a reply cut
   * short. At the deadline it rejects with {@link RequestTimeoutError}
   * (`REQUEST_TIMEOUT`); a retry that would have less than 500 ms left
   * after its back-off is not made, and the last failure is thrown instead. Operations with a
   * `timeout` argument get at least that plus 60 s. Streams: the deadline
   * covers opening them; reads are bounded by their idle timeout.
   */
  timeoutMs?: number;
  /** Extra headers sent with every request. */
  headers?: Record<string, string>;
  /** The `http.Agent` / `https.Agent` to use (default: a keep-alive agent owned by the client). */
  agent?: http.Agent;
}

/** @internal A request as the client sends it. */
export interface RawRequest {
  method: 'GET' | 'POST' | 'PUT' | 'DELETE';
  /** Path and query, starting with `/`. */
  path: string;
  headers?: Record<string, string>;
  body?: Buffer | string;
  signal?: AbortSignal;
  /** Deadline of one attempt in ms (until the response headers, or the whole body for buffered replies). */
  timeoutMs?: number;
  /** The call's deadline as a `performance.now()` time; retries never start past it (default: now + `timeoutMs`). */
  deadline?: number;
  /** `false`: no Idempotency-Key (stream reads, WebSocket). Otherwise the key to send (generated when undefined). */
  idempotencyKey?: string | false;
  /** The operation name, for error messages. */
  operation?: string;
  /** A streamed reply (SSE): the deadline stops at the response headers instead of covering the body. */
  stream?: boolean;
}

/** @internal */
export const DEFAULT_URL = 'http://127.0.0.1:7780';
const DEFAULT_TIMEOUT_MS = 630_000;
/** The least time a retry must have left before the call's deadline. */
const MIN_RETRY_LEFT_MS = 500;
/** The largest X-Sbx-Timeout-Ms the server accepts (25 h). */
const MAX_SERVER_TIMEOUT_MS = 90_000_000;
const NETWORK_CODES = new Set([
  'ECONNRESET',
  'ECONNREFUSED',
  'ECONNABORTED',
  'EPIPE',
  'ETIMEDOUT',
  'EHOSTUNREACH',
  'ENETUNREACH',
  'ENETDOWN',
  'EAI_AGAIN',
  'UND_ERR_SOCKET',
  'ERR_STREAM_PREMATURE_CLOSE',
  'ESBXIDLE',
]);

/** @internal Is this a transport failure (connection refused/reset/closed) that a retry may fix? */
export function isNetworkError(err: unknown): boolean {
  if (!err || typeof err !== 'object') return false;
  const e = err as { code?: string; message?: string };
  if (e.code && NETWORK_CODES.has(e.code)) return true;
  return e.message === 'socket hang up' || e.message === 'aborted';
}

/** @internal Sleep `ms`, rejecting early when `signal` aborts. */
export function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason);
    const t = setTimeout(() => {
      signal?.removeEventListener('abort', onAbort);
      resolve();
    }, ms);
    const onAbort = (): void => {
      clearTimeout(t);
      reject(signal!.reason);
    };
    signal?.addEventListener('abort', onAbort, { once: true });
  });
}

/** @internal Read a whole response body. */
export async function readBody(res: http.IncomingMessage): Promise<Buffer> {
  const chunks: Buffer[] = [];
  for await (const c of res) chunks.push(c as Buffer);
  return Buffer.concat(chunks);
}

/**
 * A connection to an sbx deployment's HTTP API.
 *
 * Requests carry an `Idempotency-Key` (a random UUID, the same for every
 * retry of one call), so the server answers a retried request from its
 * cache instead of running it twice. A request is retried — with capped
 * exponential back-off and jitter — only when that is safe: after a network
 * error (connection refused, reset or closed before the whole reply arrived)
 * and after `503 SHARD_UNAVAILABLE`. Every other error is thrown at once as
 * the {@link SandboxError} subclass of its code.
 *
 * @example
 * ```ts
 * const client = new SbxClient({ url: 'http://127.0.0.1:7780' });
 * const sandbox = getSandbox(client, 'my-sandbox');
 * ```
 */
export class SbxClient {
  /** The base URL (no trailing slash). */
  readonly url: string;
  private readonly base: URL;
  private readonly apiKey?: string;
  private readonly retry: Required<RetryOptions>;
  private readonly timeoutMs: number;
  private readonly extraHeaders: Record<string, string>;
  private readonly agent: http.Agent;
  private readonly ownAgent: boolean;

  /**
   * @param options - see {@link SbxClientOptions}. Throws a `TypeError` for a
   *   URL that is not `http:` or `https:`.
   */
  constructor(options: SbxClientOptions = {}) {
    const url = options.url ?? process.env.SBX_URL ?? DEFAULT_URL;
    this.base = new URL(url);
    if (this.base.protocol !== 'http:' && this.base.protocol !== 'https:')
      throw new TypeError(`SbxClient: url must be http: or https:, got ${url}`);
    this.url = url.replace(/\/+$/, '');
    this.apiKey = options.apiKey ?? (process.env.SBX_API_KEY || undefined);
    const r = options.retry === false ? { retries: 0 } : (options.retry ?? {});
    this.retry = { retries: r.retries ?? 4, minDelayMs: r.minDelayMs ?? 100, maxDelayMs: r.maxDelayMs ?? 3000 };
    this.timeoutMs = options.timeoutMs ?? DEFAULT_TIMEOUT_MS;
    this.extraHeaders = { ...(options.headers ?? {}) };
    this.ownAgent = !options.agent;
    this.agent =
      options.agent ??
      (this.base.protocol === 'https:'
        ? new https.Agent({ keepAlive: true, maxSockets: 64 })
        : new http.Agent({ keepAlive: true, maxSockets: 64 }));
  }

  /** Close idle keep-alive connections (call when done with the client so the process can exit promptly). */
  close(): void {
    if (this.ownAgent) this.agent.destroy();
  }

  /** `GET /v1/health`: `{ok: true}` when the gateway answers. */
  health(options: { signal?: AbortSignal } = {}): Promise<{ ok: boolean }> {
    return this.requestJson({ method: 'GET', path: '/v1/health', signal: options.signal, operation: 'health' });
  }

  /**
   * Every sandbox of the deployment (`list`): `{sandboxes: [status-shaped
   * objects], count}`.
   */
  listSandboxes(options: { signal?: AbortSignal } = {}): Promise<{ sandboxes: Record<string, unknown>[]; count: number }> {
    return this.requestJson({ method: 'POST', path: '/v1/list', body: '{}', signal: options.signal, operation: 'list' });
  }

  /**
   * Call a node operation (`image.*`, docs/images.md): `POST /v1/{op}`,
   * answered by the node's image store.
   */
  private nodeCall<T>(op: string, args: Record<string, unknown>, signal?: AbortSignal): Promise<T> {
    return this.requestJson({ method: 'POST', path: `/v1/${op}`, body: JSON.stringify(args), signal, operation: op });
  }

  /**
   * Import an image from `path`, a path on the server's machine: an OCI
   * image layout directory, or a `docker save` / `podman save` tarball
   * (`image.import`). Every blob is checked against its digest.
   * @returns `{digest, image}` (what {@link inspectImage} answers).
   * @throws IMAGE_INVALID (corrupt, tampered, unsafe, no /bin/sh), IMAGE_NOT_FOUND (no such path).
   */
  importImage(path: string, name?: string, options: { signal?: AbortSignal } = {}): Promise<{ digest: string; image: Record<string, unknown> }> {
    return this.nodeCall('image.import', name === undefined ? { path } : { path, name }, options.signal);
  }

  /** Pull `ref` from a registry into the node's store (`image.pull`, skopeo on the server). */
  pullImage(ref: string, name?: string, options: { signal?: AbortSignal } = {}): Promise<{ digest: string; image: Record<string, unknown> }> {
    return this.nodeCall('image.pull', name === undefined ? { ref } : { ref, name }, options.signal);
  }

  /** The backups of the node's store, expired ones removed first (`backup.list`, docs/persistence.md "Backups"). */
  listBackups(options: { signal?: AbortSignal } = {}): Promise<{ backups: Record<string, unknown>[] }> {
    return this.nodeCall('backup.list', {}, options.signal);
  }

  /** Delete a backup (`backup.delete`). @throws BACKUP_NOT_FOUND */
  deleteBackup(id: string, options: { signal?: AbortSignal } = {}): Promise<{ success: boolean }> {
    return this.nodeCall('backup.delete', { id }, options.signal);
  }

  /** The images of the node's store (`image.list`). */
  listImages(options: { signal?: AbortSignal } = {}): Promise<{ images: Record<string, unknown>[] }> {
    return this.nodeCall('image.list', {}, options.signal);
  }

  /** An image's names, layers and config (`image.inspect`). @throws IMAGE_NOT_FOUND */
  inspectImage(image: string, options: { signal?: AbortSignal } = {}): Promise<{ digest: string; image: Record<string, unknown> }> {
    return this.nodeCall('image.inspect', { image }, options.signal);
  }

  /** Remove a name (or, by digest, every name) of an image, then unused layers (`image.rm`). */
  removeImage(image: string, options: { signal?: AbortSignal } = {}): Promise<{ success: boolean; removed: number }> {
    return this.nodeCall('image.rm', { image }, options.signal);
  }

  /**
   * Build the image `name` from `from` plus the shell strings `run`, run in
   * order in a sandbox of it (`template.build`, docs/images.md "Templates"):
   * its writable layer becomes the new image's top layer.
   * @returns `{digest, image}` of the new image.
   * @throws TEMPLATE_BUILD_FAILED (a step exited non-zero: its output in the message), IMAGE_NOT_FOUND.
   */
  buildTemplate(name: string, from: string, run: string[], options: { stepTimeout?: number; signal?: AbortSignal } = {}): Promise<{ digest: string; image: Record<string, unknown> }> {
    const args: Record<string, unknown> = { name, from, run };
    if (options.stepTimeout !== undefined) args.stepTimeout = options.stepTimeout;
    return this.nodeCall('template.build', args, options.signal);
  }

  /** Gateway and shard health (`cluster.status`), see docs/protocol.md §3. */
  clusterStatus(options: { signal?: AbortSignal } = {}): Promise<Record<string, unknown>> {
    return this.requestJson({
      method: 'POST',
      path: '/v1/cluster.status',
      body: '{}',
      signal: options.signal,
      operation: 'cluster.status',
    });
  }

  /**
   * Call one sandbox operation: `POST /v1/sandboxes/{sandboxId}/{op}` with
   * `args` as the JSON body. The low-level door to every operation of
   * docs/protocol.md; the {@link Sandbox} methods are built on it.
   *
   * @param sandboxId - the sandbox ID.
   * @param op - the operation, e.g. `exec`, `file.read`.
   * @param args - its arguments (`undefined` fields are dropped).
   * @param options - `signal` to abort; `timeoutMs` for the client-side deadline.
   * @returns the operation's result object.
   * @throws {@link SandboxError} (the subclass for the error code).
   */
  call<T = Record<string, unknown>>(
    sandboxId: string,
    op: string,
    args: Record<string, unknown> = {},
    options: { signal?: AbortSignal; timeoutMs?: number } = {},
  ): Promise<T> {
    return this.requestJson<T>({
      method: 'POST',
      path: `/v1/sandboxes/${encodeURIComponent(sandboxId)}/${op}`,
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify(args),
      signal: options.signal,
      timeoutMs: options.timeoutMs ?? this.deadlineFor(args),
      operation: op,
    });
  }

  /** @internal The client-side deadline for an operation with these arguments. */
  deadlineFor(args: Record<string, unknown>): number {
    let t = this.timeoutMs;
    for (const k of ['timeout', 'cloneTimeoutMs']) {
      const v = args[k];
      if (typeof v === 'number' && v > 0) t = Math.max(t, v + 60_000);
    }
    return t;
  }

  /** @internal Headers of every request. */
  authHeaders(): Record<string, string> {
    // x-sbx-client: without API keys the server refuses mutating requests
    // that lack it, which no web page can send cross-origin (docs/http.md).
    const h: Record<string, string> = { 'x-sbx-client': 'sbx-sandbox-typescript/0.1', ...this.extraHeaders };
    if (this.apiKey) h.authorization = `Bearer ${this.apiKey}`;
    return h;
  }

  /** @internal The API key, if any (whether URLs need a minted token). */
  get key(): string | undefined {
    return this.apiKey;
  }

  /** @internal Absolute URL for a path. */
  resolve(path: string): URL {
    const basePath = this.base.pathname.replace(/\/+$/, '');
    return new URL(basePath + path, this.base);
  }

  /** @internal The agent, for upgrade requests. */
  get httpAgent(): http.Agent {
    return this.agent;
  }

  /**
   * @internal One attempt: send the request, resolve with the response once
   * its headers arrived (body unread). Rejects with the network error, a
   * {@link RequestTimeoutError} at the deadline, or the signal's reason.
   */
  send(req: RawRequest, idempotencyKey?: string): Promise<http.IncomingMessage> {
    const url = this.resolve(req.path);
    const mod = url.protocol === 'https:' ? https : http;
    const headers: Record<string, string> = { ...this.authHeaders(), ...(req.headers ?? {}) };
    if (idempotencyKey) headers['idempotency-key'] = idempotencyKey;
    if (req.body !== undefined) headers['content-length'] = String(Buffer.byteLength(req.body));
    const timeoutMs = req.timeoutMs ?? this.timeoutMs;
    // The server's deadline is ours (docs/http.md): it answers a stuck shard
    // SHARD_UNAVAILABLE while we still listen. Capped at its 25 h ceiling.
    headers['x-sbx-timeout-ms'] = String(Math.min(Math.max(1, Math.ceil(timeoutMs)), MAX_SERVER_TIMEOUT_MS));
    return new Promise((resolve, reject) => {
      req.signal?.throwIfAborted();
      const r = mod.request(url, { method: req.method, headers, agent: this.agent });
      let settled = false;
      let response: http.IncomingMessage | undefined;
      const timer = setTimeout(() => {
        const e = new RequestTimeoutError({
          code: 'REQUEST_TIMEOUT',
          message: `${req.operation ?? req.path}: no reply within ${timeoutMs} ms`,
          operation: req.operation,
        });
        // A body still arriving at the deadline fails with the same error.
        response?.destroy(e);
        r.destroy(e);
      }, timeoutMs);
      const onAbort = (): void => {
        r.destroy(req.signal!.reason instanceof Error ? req.signal!.reason : new Error(String(req.signal!.reason)));
      };
      req.signal?.addEventListener('abort', onAbort, { once: true });
      const done = (): void => {
        clearTimeout(timer);
        req.signal?.removeEventListener('abort', onAbort);
      };
      r.on('response', (res) => {
        settled = true;
        response = res;
        // The deadline also covers reading a buffered body, and the error
        // body of a stream; a stream's events end it here.
        if (req.stream && res.statusCode === 200) done();
        else res.once('close', done);
        resolve(res);
      });
      r.on('error', (err) => {
        done();
        if (!settled) reject(err);
      });
      r.end(req.body);
    });
  }

  /**
   * @internal Send with retries (network errors before the reply, and
   * `503 SHARD_UNAVAILABLE`); resolve with the final response (any status,
   * body unread, except a retried 503 whose body was consumed).
   */
  async sendWithRetry(req: RawRequest): Promise<http.IncomingMessage> {
    const key = req.idempotencyKey === false ? undefined : (req.idempotencyKey ?? randomUUID());
    const deadline = req.deadline ?? performance.now() + (req.timeoutMs ?? this.timeoutMs);
    let attempt = 0;
    // The first attempt whose outcome is not known (it may have taken
    // effect): a retry that then fails with an error saying "did not run"
    // (WRONG_OWNER, …) gives the retry's outcome, not the request's, which
    // stays unknown — so that earlier error is thrown (naming the last
    // answer).  Issue 11: the fault test read back writes answered so.
    let unknown: unknown;
    for (;;) {
      let res: http.IncomingMessage;
      try {
        // An attempt after one of unknown outcome says so (docs/http.md
        // X-Sbx-Retry): a shard that took the sandbox over from a failed one
        // then answers OPERATION_INTERRUPTED instead of running it twice.
        const headers = unknown !== undefined && key ? { ...(req.headers ?? {}), 'x-sbx-retry': '1' } : req.headers;
        res = await this.send({ ...req, headers, timeoutMs: this.timeLeft(deadline, req) }, key);
      } catch (err) {
        if (isNetworkError(err) && attempt < this.retry.retries && !req.signal?.aborted) {
          const e = this.wrapTransportError(err, req);
          unknown ??= e;
          await this.pause(attempt++, req, deadline, e);
          continue;
        }
        throw this.wrapTransportError(err, req);
      }
      if (res.statusCode === 503 && attempt < this.retry.retries) {
        let body: Buffer;
        try {
          body = await readBody(res);
        } catch (err) {
          if (isNetworkError(err)) {
            const e = this.wrapTransportError(err, req);
            unknown ??= e;
            await this.pause(attempt++, req, deadline, e);
            continue;
          }
          throw this.wrapTransportError(err, req);
        }
        const parsed = parseError(body, 503);
        if (parsed.code === 'SHARD_UNAVAILABLE') {
          const e = createErrorFromResponse({ ...parsed, operation: parsed.operation ?? req.operation }, 503);
          // context.ran false: the gateway never delivered it to a shard
          // (docs/protocol.md "Retries"), so nothing ran and a later answer
          // is the request's own outcome.
          if (parsed.context?.ran !== false) unknown ??= e;
          await this.pause(attempt++, req, deadline, e);
          continue;
        }
        throw createErrorFromResponse({ ...parsed, operation: parsed.operation ?? req.operation }, 503);
      }
      if (unknown instanceof SandboxError && (res.statusCode ?? 0) >= 400) {
        const body = await readBody(res);
        const parsed = parseError(body, res.statusCode ?? 500);
        if (UNKNOWN_CODES.has(parsed.code))
          throw createErrorFromResponse({ ...parsed, operation: parsed.operation ?? req.operation }, res.statusCode);
        throw createErrorFromResponse({
          code: unknown.code,
          message: `${unknown.message} (the request's outcome is unknown: a retry with the same ` +
            `idempotency key then answered ${parsed.code}: ${parsed.message})`,
          operation: req.operation,
        } as ErrorResponse, unknown.httpStatus);
      }
      return res;
    }
  }

  /**
   * @internal Send with retries and parse the JSON reply; throws the mapped
   * error for an error status. A body cut short by a network error is
   * retried too (same Idempotency-Key: the server answers from its cache).
   */
  async requestJson<T>(req: RawRequest): Promise<T> {
    const key = req.idempotencyKey === false ? false : (req.idempotencyKey ?? randomUUID());
    const deadline = req.deadline ?? performance.now() + (req.timeoutMs ?? this.timeoutMs);
    let attempt = 0;
    for (;;) {
      const res = await this.sendWithRetry({ ...req, idempotencyKey: key, deadline });
      let body: Buffer;
      try {
        body = await readBody(res);
      } catch (err) {
        if (isNetworkError(err) && attempt < this.retry.retries && !req.signal?.aborted) {
          await this.pause(attempt++, req, deadline, this.wrapTransportError(err, req));
          continue;
        }
        throw this.wrapTransportError(err, req);
      }
      const status = res.statusCode ?? 0;
      if (status >= 400) {
        const parsed = parseError(body, status);
        throw createErrorFromResponse({ ...parsed, operation: parsed.operation ?? req.operation }, status);
      }
      if (body.length === 0) return {} as T;
      try {
        return JSON.parse(body.toString('utf8')) as T;
      } catch (err) {
        throw new SandboxError(
          { code: 'INVALID_JSON_RESPONSE', message: `${req.operation ?? req.path}: the reply is not JSON`, httpStatus: status },
          { cause: err },
        );
      }
    }
  }

  /**
   * @internal The ms left before `deadline` for the next attempt; throws
   * {@link RequestTimeoutError} when none is left.
   */
  timeLeft(deadline: number, req: RawRequest): number {
    const left = Math.floor(deadline - performance.now());
    if (left < 1)
      throw new RequestTimeoutError({
        code: 'REQUEST_TIMEOUT',
        message: `${req.operation ?? req.path}: no reply within the call's deadline`,
        operation: req.operation,
      });
    return left;
  }

  /**
   * @internal Back off before retry number `attempt`, unless the retry would
   * have less than {@link MIN_RETRY_LEFT_MS} left before `deadline` (too
   * little to hear the server's answer): then throw `last`, the failure
   * being retried.
   */
  async pause(attempt: number, req: RawRequest, deadline: number, last: unknown): Promise<void> {
    const d = this.backoff(attempt);
    if (performance.now() + d + MIN_RETRY_LEFT_MS > deadline) throw last;
    await sleep(d, req.signal);
  }

  /** @internal Back-off before retry number `attempt` (0-based): capped exponential with jitter. */
  backoff(attempt: number): number {
    const d = Math.min(this.retry.maxDelayMs, this.retry.minDelayMs * 2 ** attempt);
    return Math.round(d / 2 + Math.random() * (d / 2));
  }

  /** @internal The retry policy. */
  get retryPolicy(): Required<RetryOptions> {
    return this.retry;
  }

  /** @internal Turn a transport failure into the SDK's error (abort reasons pass through). */
  wrapTransportError(err: unknown, req: { signal?: AbortSignal; operation?: string; path?: string }): unknown {
    if (err instanceof SandboxError) return err;
    if (req.signal?.aborted) return req.signal.reason ?? err;
    if (isNetworkError(err)) {
      const e = err as { code?: string; message?: string };
      return new GatewayUnavailableError(
        {
          code: 'GATEWAY_UNAVAILABLE',
          message: `${req.operation ?? req.path ?? 'request'}: cannot reach ${this.url}: ${e.code ?? ''} ${e.message ?? ''}`.trim(),
          operation: req.operation,
        },
        { cause: err },
      );
    }
    return err;
  }
}

/** @internal Parse an error body (JSON or not). */
/** Answers after which a request may have taken effect (docs/protocol.md §4). */
const UNKNOWN_CODES = new Set(['SHARD_UNAVAILABLE', 'REQUEST_TIMEOUT', 'GATEWAY_UNAVAILABLE',
  'INTERNAL_ERROR', 'OPERATION_INTERRUPTED']);

export function parseError(body: Buffer, status: number): ErrorResponse {
  const text = body.toString('utf8');
  try {
    const j = JSON.parse(text) as Partial<ErrorResponse> & { error?: string };
    if (j && typeof j === 'object' && typeof j.code === 'string') {
      return {
        code: j.code,
        message: typeof j.message === 'string' ? j.message : (j.error ?? j.code),
        context: j.context ?? {},
        httpStatus: j.httpStatus ?? status,
        operation: j.operation,
      };
    }
  } catch {
    // not JSON
  }
  return {
    code: status === 401 ? 'UNAUTHORIZED' : status === 404 ? 'ROUTE_NOT_FOUND' : 'UNKNOWN_ERROR',
    message: text.trim() || `HTTP ${status}`,
    context: {},
    httpStatus: status,
  };
}
