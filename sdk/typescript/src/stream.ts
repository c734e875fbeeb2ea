/**
 * Resumable event streams over Server-Sent Events.
 *
 * @module
 */

import type http from 'node:http';

import { isNetworkError, parseError, readBody, sleep, type SbxClient } from './client.js';
import { createErrorFromResponse, GatewayUnavailableError } from './errors.js';
import { SSEParser } from './sse.js';
import type { StreamEventBase } from './types.js';

/** @internal How an {@link EventStream} reconnects and cancels. */
export interface EventStreamInit {
  client: SbxClient;
  sandboxId: string;
  /** The operation that opened it (for error messages). */
  operation: string;
  /** The first response (status 200, `text/event-stream`), body unread. */
  response: http.IncomingMessage;
  /** Stream ID when the response header does not carry it. */
  streamId?: string;
  /** The response continues the stream after this event (a resumption): `lastEventId` starts there. */
  after?: number;
  /** Resume after a dropped connection (default true). */
  resumable?: boolean;
  /** Leaving the iteration early (break, return, throw) cancels the producer with `stream.cancel`. */
  cancelOnReturn?: boolean;
  /** Aborting closes the connection and makes iteration throw the reason. */
  signal?: AbortSignal;
  /** Called with every event before it is yielded (used by exec's `onOutput`, etc.). */
  transform?: (ev: Record<string, unknown>) => Record<string, unknown> | undefined;
  /** Consecutive failed reconnections before giving up (default: the client's retry count + 2). */
  maxReconnects?: number;
  /** No bytes for this long (ms) = a dead connection (default 45 000; the server pings every 15 s). */
  idleTimeoutMs?: number;
}

/**
 * A stream of events from the server (`execStream`, `streamProcessLogs`,
 * `readFileStream`, `watch`, `runCodeStream`): an async iterable of parsed
 * events, to be read once with `for await`.
 *
 * The SSE `id:` of every event (its `seq`) is tracked in
 * {@link EventStream.lastEventId}. When the connection drops before the
 * stream's end, the stream reconnects by itself
 * (`GET /v1/sandboxes/{id}/streams/{streamId}` with `Last-Event-ID`, capped
 * exponential back-off) and goes on with the next event; events already
 * yielded are never yielded twice. If events were lost in between (a ring
 * stream that overwrote them, or a server that could not replay them), a
 * `{type: 'gap', missed}` event says how many.
 *
 * Leaving a `for await` loop early, or calling {@link EventStream.cancel},
 * stops the producer on the server (a command is killed like a timeout, a
 * watch ends) — except for process logs, which only disconnect. Aborting the
 * `signal` given at creation, or {@link EventStream.close}, only closes the
 * connection: the stream stays on the server, resumable with
 * `sandbox.resumeStream(streamId, lastEventId)`.
 *
 * @typeParam T - the event type.
 */
export class EventStream<T extends StreamEventBase = StreamEventBase> implements AsyncIterable<T> {
  /** @internal Marks parsed-event sources for `parseSSEStream`. */
  readonly __sbxEventStream = true;
  /** The server's stream ID (e.g. `exec-3`, `proc:web`), for `resumeStream`. */
  readonly streamId: string | undefined;
  /** `seq` of the last event yielded (0 before the first). */
  lastEventId = 0;
  /** How many times the connection was re-established. */
  reconnects = 0;
  /** The stream's end was reached (its last event was delivered). */
  done = false;

  private readonly init: EventStreamInit;
  private res: http.IncomingMessage | undefined;
  private started = false;
  private retryMs = 1000;
  private closed = false;

  /** @internal Use the Sandbox methods that return streams. */
  constructor(init: EventStreamInit) {
    this.init = init;
    this.res = init.response;
    const hdr = init.response.headers['x-sbx-stream-id'];
    this.streamId = (Array.isArray(hdr) ? hdr[0] : hdr) ?? init.streamId;
    this.lastEventId = init.after ?? 0;
  }

  /** Iterate the events (once). */
  [Symbol.asyncIterator](): AsyncIterator<T> {
    if (this.started) throw new Error('EventStream: a stream can be iterated only once');
    this.started = true;
    return this.run();
  }

  /** Collect every event until the end into an array. */
  async toArray(): Promise<T[]> {
    const out: T[] = [];
    for await (const ev of this) out.push(ev);
    return out;
  }

  /**
   * Stop the producer on the server (`stream.cancel`: a command is killed —
   * its `complete` has `cancelled: true`, exit 130 —, a watch stops) and
   * close the connection. Not for process logs (use `kill()`).
   */
  async cancel(): Promise<void> {
    this.close();
    if (!this.done && this.streamId) await this.cancelRemote();
  }

  /** Close the connection only; the stream stays on the server (resumable for 5 minutes). */
  close(): void {
    this.closed = true;
    this.res?.destroy();
  }

  private async cancelRemote(): Promise<void> {
    if (!this.streamId || this.streamId.startsWith('proc:')) return;
    try {
      await this.init.client.call(this.init.sandboxId, 'stream.cancel', { streamId: this.streamId });
    } catch {
      // Already gone: nothing to cancel.
    }
  }

  private async *run(): AsyncGenerator<T, void, undefined> {
    const { signal } = this.init;
    const maxReconnects = this.init.maxReconnects ?? this.init.client.retryPolicy.retries + 2;
    let failures = 0;
    let resumed = this.lastEventId > 0;
    let finishedNormally = false;
    const onAbort = (): void => {
      this.res?.destroy();
    };
    signal?.addEventListener('abort', onAbort, { once: true });
    try {
      for (;;) {
        signal?.throwIfAborted();
        const res = this.res!;
        let sawServerGap = false;
        let firstOnConnection = true;
        try {
          for await (const m of readSSE(res, this.init.idleTimeoutMs ?? 45_000)) {
            if (m.retry !== undefined) this.retryMs = m.retry;
            let ev: Record<string, unknown>;
            try {
              ev = JSON.parse(m.data) as Record<string, unknown>;
            } catch {
              continue;
            }
            const seq = m.id !== undefined && m.id !== '' ? Number(m.id) : (ev.seq as number | undefined);
            if (ev.type === 'gap') sawServerGap = true;
            if (typeof seq === 'number' && Number.isFinite(seq) && seq > 0) {
              if (seq <= this.lastEventId) continue; // already delivered
              if (resumed && firstOnConnection && !sawServerGap && seq > this.lastEventId + 1) {
                const gap = { type: 'gap', missed: seq - this.lastEventId - 1 } as unknown as T;
                yield gap;
              }
              firstOnConnection = false;
              this.lastEventId = seq;
            }
            failures = 0;
            const out = this.init.transform ? this.init.transform(ev) : ev;
            if (out !== undefined) yield out as unknown as T;
          }
          this.done = true;
          finishedNormally = true;
          return;
        } catch (err) {
          signal?.throwIfAborted();
          if (this.closed) {
            finishedNormally = true; // close(): end quietly
            return;
          }
          const resumable = this.init.resumable !== false && this.streamId !== undefined;
          if (!resumable || !isNetworkError(err)) throw this.init.client.wrapTransportError(err, { operation: this.init.operation });
          // Reconnect with Last-Event-ID, backing off; a 404 (stream gone) is thrown.
          for (;;) {
            if (failures >= maxReconnects)
              throw new GatewayUnavailableError(
                {
                  code: 'GATEWAY_UNAVAILABLE',
                  message: `${this.init.operation}: stream ${this.streamId} lost and could not be resumed after ${failures} attempts`,
                  operation: this.init.operation,
                },
                { cause: err },
              );
            // The first reconnection is immediate: a waiting read on a dead
            // connection keeps consuming events until a newer read replaces
            // it. Later ones back off (at least the server's `retry:` hint).
            const delay = failures === 0 ? 0 : Math.max(this.init.client.backoff(failures - 1), Math.min(this.retryMs, 1000));
            failures++;
            await sleep(delay, signal);
            try {
              this.res = await openStreamResponse(this.init.client, this.init.sandboxId, this.streamId!, this.lastEventId, signal);
              this.reconnects++;
              resumed = true;
              break;
            } catch (e2) {
              if (!isNetworkError(e2)) throw this.init.client.wrapTransportError(e2, { operation: this.init.operation, signal });
            }
          }
        }
      }
    } finally {
      signal?.removeEventListener('abort', onAbort);
      this.res?.destroy();
      if (!finishedNormally && !this.done && this.init.cancelOnReturn && !signal?.aborted) await this.cancelRemote();
    }
  }
}

/**
 * @internal `GET /v1/sandboxes/{sandbox}/streams/{streamId}` with
 * `Last-Event-ID: after` (one attempt). Resolves with a 200 response;
 * rejects with the mapped error (e.g. `StreamNotFoundError`) or a network error.
 */
export async function openStreamResponse(
  client: SbxClient,
  sandboxId: string,
  streamId: string,
  after: number,
  signal?: AbortSignal,
): Promise<http.IncomingMessage> {
  const res = await client.send(
    {
      method: 'GET',
      path: `/v1/sandboxes/${encodeURIComponent(sandboxId)}/streams/${encodeURIComponent(streamId)}`,
      headers: { accept: 'text/event-stream', 'last-event-id': String(after) },
      signal,
      stream: true,
      idempotencyKey: false,
      operation: 'stream.read',
    },
    undefined,
  );
  if (res.statusCode !== 200) {
    const body = await readBody(res);
    const status = res.statusCode ?? 0;
    const parsed = parseError(body, status);
    if (status === 503 && parsed.code === 'SHARD_UNAVAILABLE') {
      const e = new Error('shard unavailable') as Error & { code: string };
      e.code = 'ECONNRESET'; // retried like a network error
      throw e;
    }
    throw createErrorFromResponse({ ...parsed, operation: parsed.operation ?? 'stream.read' }, status);
  }
  return res;
}

/** @internal Open a stream operation (`POST …/{op}` with `Accept: text/event-stream`), with retries. */
export async function openOperationStream(
  client: SbxClient,
  sandboxId: string,
  op: string,
  args: Record<string, unknown>,
  signal?: AbortSignal,
): Promise<http.IncomingMessage> {
  const res = await client.sendWithRetry({
    method: 'POST',
    path: `/v1/sandboxes/${encodeURIComponent(sandboxId)}/${op}`,
    headers: { 'content-type': 'application/json', accept: 'text/event-stream' },
    body: JSON.stringify(args),
    signal,
    stream: true,
    operation: op,
  });
  if (res.statusCode !== 200) {
    const body = await readBody(res);
    const status = res.statusCode ?? 0;
    const parsed = parseError(body, status);
    throw createErrorFromResponse({ ...parsed, operation: parsed.operation ?? op }, status);
  }
  return res;
}

/**
 * @internal Read SSE messages from a response. Ends when the response ends
 * cleanly; throws a network error when the connection breaks, or when no
 * byte arrived for `idleMs` (code `ESBXIDLE`).
 */
async function* readSSE(res: http.IncomingMessage, idleMs: number): AsyncGenerator<{ id?: string; event: string; data: string; retry?: number }> {
  const parser = new SSEParser();
  const decoder = new TextDecoder('utf-8');
  res.setTimeout(idleMs, () => {
    const e = new Error(`no data for ${idleMs} ms`) as Error & { code: string };
    e.code = 'ESBXIDLE';
    res.destroy(e);
  });
  let ended = false;
  res.once('end', () => (ended = true));
  for await (const chunk of res) {
    for (const m of parser.feed(decoder.decode(chunk as Buffer, { stream: true }))) yield m;
  }
  // Node reports a connection closed mid-body as an 'aborted' error; guard
  // against a silent close all the same.
  if (!ended && !res.complete) {
    const e = new Error('aborted') as Error & { code: string };
    e.code = 'ECONNRESET';
    throw e;
  }
}
