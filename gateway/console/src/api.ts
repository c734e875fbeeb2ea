// api.ts — the console's calls to the gateway's HTTP front (docs/http.md),
// always on the console's own origin.  The API key lives in sessionStorage
// (this tab only, gone when it closes) and travels as the API's header,
// Authorization: Bearer <key>; never in a URL: the terminal's WebSocket
// carries a 60 s token minted for it (wsCredential below).  Without a key (the keyless loopback
// front) every request carries X-Sbx-Client, which the front demands of
// every mutating request (docs/http.md, "Browsers").

const KEY = 'sbx.console.key';

export function getKey(): string {
  return sessionStorage.getItem(KEY) ?? '';
}

export function setKey(k: string): void {
  if (k) sessionStorage.setItem(KEY, k);
  else sessionStorage.removeItem(KEY);
}

/** An error answer of the front: its stable code, message and HTTP status. */
export class ApiError extends Error {
  constructor(public code: string, message: string, public status: number) {
    super(message);
  }
}

export function headers(extra?: Record<string, string>): Headers {
  const h = new Headers(extra);
  h.set('X-Sbx-Client', 'sbx-console');
  const k = getKey();
  if (k) h.set('Authorization', `Bearer ${k}`);
  return h;
}

async function fail(r: Response): Promise<never> {
  let code = 'HTTP_' + r.status;
  let message = r.statusText;
  try {
    const j = await r.json();
    code = j.code ?? code;
    message = j.message ?? message;
  } catch {
    /* not JSON */
  }
  throw new ApiError(code, message, r.status);
}

/** Any request; the answer when it is 2xx, else an ApiError. */
export async function request(method: string, path: string, body?: BodyInit | null,
                              extra?: Record<string, string>): Promise<Response> {
  const r = await fetch(path, { method, headers: headers(extra), body: body ?? null });
  if (!r.ok) await fail(r);
  return r;
}

/** An operation of a sandbox (POST /v1/sandboxes/{id}/{op}) with JSON args. */
export async function op<T = any>(sandbox: string, name: string, args: object = {}): Promise<T> {
  const r = await request('POST', `/v1/sandboxes/${encodeURIComponent(sandbox)}/${name}`,
                          JSON.stringify(args), { 'Content-Type': 'application/json' });
  return r.json();
}

/** A deployment-wide operation (POST /v1/{op}). */
export async function globalOp<T = any>(name: string, args: object = {}): Promise<T> {
  const r = await request('POST', `/v1/${name}`, JSON.stringify(args),
                          { 'Content-Type': 'application/json' });
  return r.json();
}

/** The raw-file route of a path (absolute; each segment escaped). */
export function fileUrl(sandbox: string, path: string): string {
  const segs = path.split('/').filter((s) => s !== '').map(encodeURIComponent);
  return `/v1/sandboxes/${encodeURIComponent(sandbox)}/files/${segs.join('/')}`;
}

/**
 * The credential for sandbox's terminal WebSocket URL: browsers cannot set
 * headers on a WebSocket, so with keys the front takes ?access_token= — not
 * the key (keys never go into URLs), a token minted with the key in the
 * header by POST …/url-token?purpose=terminal, good for this sandbox's
 * terminal only, for 60 s (docs/http.md, "Tokens in URLs").  '' when
 * keyless.
 */
export async function wsCredential(sandbox: string): Promise<string> {
  if (!getKey()) return '';
  const r = await request('POST', `/v1/sandboxes/${encodeURIComponent(sandbox)}/url-token?purpose=terminal`);
  return (await r.json()).token;
}

/**
 * Read a stream as Server-Sent Events with fetch (so the key goes as a
 * header, never in the URL, unlike EventSource): calls onEvent with each
 * event's parsed data until the stream ends or signal aborts.
 */
export async function sse(path: string, onEvent: (ev: any) => void, signal: AbortSignal): Promise<void> {
  const r = await fetch(path, { headers: headers({ Accept: 'text/event-stream' }), signal });
  if (!r.ok) await fail(r);
  if (!r.body) return;
  const reader = r.body.pipeThrough(new TextDecoderStream()).getReader();
  let buf = '';
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buf += value;
    let i;
    while ((i = buf.indexOf('\n\n')) >= 0) {
      const block = buf.slice(0, i);
      buf = buf.slice(i + 2);
      const data = block.split('\n').filter((l) => l.startsWith('data:'))
        .map((l) => l.slice(5).trimStart()).join('\n');
      if (data) {
        try {
          onEvent(JSON.parse(data));
        } catch {
          /* a malformed event is skipped */
        }
      }
    }
  }
}
