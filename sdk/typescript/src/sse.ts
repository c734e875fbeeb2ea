/**
 * Server-Sent Events parsing (WHATWG HTML §9.2.6), incremental.
 *
 * @module
 */

/** One dispatched SSE message. */
export interface SSEMessage {
  /** The `id:` field of the message (the last one seen, per the spec), if the message carried one. */
  id?: string;
  /** The `event:` field; `message` when absent. */
  event: string;
  /** The `data:` lines joined with `\n`. */
  data: string;
  /** A `retry:` field seen since the previous message (reconnection delay in ms). */
  retry?: number;
}

/**
 * Incremental SSE parser: feed it text as it arrives, get the complete
 * messages back. Comments (`: ping`) are ignored; a message without `data:`
 * is not dispatched (its `id:` and `retry:` are still reported on the next one).
 */
export class SSEParser {
  private buf = '';
  private data: string[] = [];
  private event = '';
  private id: string | undefined;
  private idSet = false;
  private retry: number | undefined;
  private sawCR = false;

  /** Parse `chunk` (already decoded text); returns the messages it completed. */
  feed(chunk: string): SSEMessage[] {
    const out: SSEMessage[] = [];
    let text = chunk;
    // A CR at the end of the previous chunk may be the first half of CRLF.
    if (this.sawCR && text.startsWith('\n')) text = text.slice(1);
    this.sawCR = false;
    this.buf += text;
    let start = 0;
    for (let i = 0; i < this.buf.length; i++) {
      const c = this.buf.charCodeAt(i);
      if (c !== 10 && c !== 13) continue;
      const line = this.buf.slice(start, i);
      if (c === 13) {
        if (i + 1 < this.buf.length) {
          if (this.buf.charCodeAt(i + 1) === 10) i++;
        } else {
          this.sawCR = true;
        }
      }
      start = i + 1;
      this.line(line, out);
    }
    this.buf = this.buf.slice(start);
    return out;
  }

  private line(line: string, out: SSEMessage[]): void {
    if (line === '') {
      if (this.data.length > 0) {
        const m: SSEMessage = { event: this.event || 'message', data: this.data.join('\n') };
        if (this.idSet) m.id = this.id;
        if (this.retry !== undefined) m.retry = this.retry;
        out.push(m);
      }
      this.data = [];
      this.event = '';
      this.idSet = false;
      this.retry = undefined;
      return;
    }
    if (line.startsWith(':')) return;
    const colon = line.indexOf(':');
    const field = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? '' : line.slice(colon + 1);
    if (value.startsWith(' ')) value = value.slice(1);
    switch (field) {
      case 'data':
        this.data.push(value);
        break;
      case 'event':
        this.event = value;
        break;
      case 'id':
        if (!value.includes('\0')) {
          this.id = value;
          this.idSet = true;
        }
        break;
      case 'retry':
        if (/^\d+$/.test(value)) this.retry = Number(value);
        break;
      default:
        break;
    }
  }
}

/**
 * Parse an SSE byte stream into the JSON values of its `data:` fields
 * (what `@cloudflare/sandbox`'s `parseSSEStream` does).
 *
 * Accepts a web `ReadableStream<Uint8Array>`, any async iterable of bytes or
 * strings (e.g. a Node `IncomingMessage`), or an async iterable of already
 * parsed events — such as the `EventStream` that this SDK's `execStream`,
 * `streamProcessLogs`, `readFileStream`, `runCodeStream` and `watch` return —
 * which is passed through unchanged. Programs written for Cloudflare's SDK
 * (`for await (const ev of parseSSEStream(await sandbox.execStream(cmd)))`)
 * therefore keep working.
 *
 * @typeParam T - the event type.
 * @param stream - the SSE source.
 * @param signal - stops the iteration (throws the signal's reason) when aborted.
 */
export async function* parseSSEStream<T = unknown>(
  stream: ReadableStream<Uint8Array> | AsyncIterable<Uint8Array | string | T>,
  signal?: AbortSignal,
): AsyncGenerator<T, void, undefined> {
  if (isEventSource(stream)) {
    for await (const ev of stream as AsyncIterable<T>) {
      signal?.throwIfAborted();
      yield ev;
    }
    return;
  }
  const parser = new SSEParser();
  const decoder = new TextDecoder('utf-8');
  const iterable: AsyncIterable<Uint8Array | string> =
    typeof (stream as ReadableStream<Uint8Array>).getReader === 'function'
      ? readableToIterable(stream as ReadableStream<Uint8Array>)
      : (stream as AsyncIterable<Uint8Array | string>);
  for await (const chunk of iterable) {
    signal?.throwIfAborted();
    const text = typeof chunk === 'string' ? chunk : decoder.decode(chunk, { stream: true });
    for (const m of parser.feed(text)) {
      if (m.data === '[DONE]') return;
      try {
        yield JSON.parse(m.data) as T;
      } catch {
        // Not JSON: skipped, as Cloudflare's parser does.
      }
    }
  }
}

/** Does this object yield parsed events rather than bytes? (an EventStream or similar). */
function isEventSource(s: unknown): boolean {
  return typeof s === 'object' && s !== null && (s as { __sbxEventStream?: boolean }).__sbxEventStream === true;
}

async function* readableToIterable(rs: ReadableStream<Uint8Array>): AsyncGenerator<Uint8Array> {
  const reader = rs.getReader();
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      if (value) yield value;
    }
  } finally {
    reader.releaseLock();
  }
}
