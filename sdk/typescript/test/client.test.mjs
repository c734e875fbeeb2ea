// The client: error classes, retries with idempotency keys, configuration,
// sandbox lifecycle.
import assert from 'node:assert/strict';
import http from 'node:http';
import { describe, it } from 'node:test';

import {
  ContainerUnavailableError,
  createErrorFromResponse,
  ERROR_CLASSES,
  FileNotFoundError,
  GatewayUnavailableError,
  getSandbox,
  SandboxError,
  SandboxNotFoundError,
  SbxClient,
  ShardUnavailableError,
  ValidationFailedError,
} from '../dist/index.js';
import { useDaemon } from './helpers.mjs';

const ctx = useDaemon();

/** A fake API server answering with `handler(req, n)` (n = 1, 2, …). */
async function fakeServer(handler) {
  const seen = [];
  const server = http.createServer((req, res) => {
    const chunks = [];
    req.on('data', (c) => chunks.push(c));
    req.on('end', () => {
      seen.push({ method: req.method, url: req.url, headers: req.headers, body: Buffer.concat(chunks).toString() });
      handler(req, res, seen.length);
    });
  });
  await new Promise((r) => server.listen(0, '127.0.0.1', r));
  return { url: `http://127.0.0.1:${server.address().port}`, seen, close: () => new Promise((r) => server.close(r)) };
}

const json = (res, status, body) => {
  res.writeHead(status, { 'content-type': 'application/json' });
  res.end(JSON.stringify(body));
};

describe('errors', () => {
  it('maps every code to its class, all SandboxErrors', () => {
    for (const [code, Cls] of Object.entries(ERROR_CLASSES)) {
      const err = createErrorFromResponse({ code, message: `m ${code}`, context: { a: 1 }, operation: 'op' }, 418);
      assert.ok(err instanceof Cls, code);
      assert.ok(err instanceof SandboxError, code);
      assert.ok(err instanceof Error, code);
      assert.equal(err.code, code);
      assert.equal(err.httpStatus, 418);
      assert.equal(err.operation, 'op');
      assert.deepEqual(err.context, { a: 1 });
      assert.equal(err.name, Cls.name);
    }
    const unknown = createErrorFromResponse({ code: 'SOMETHING_NEW', message: 'x', httpStatus: 500 });
    assert.equal(unknown.constructor, SandboxError);
    const j = JSON.parse(JSON.stringify(createErrorFromResponse({ code: 'FILE_NOT_FOUND', message: 'gone', context: { path: '/p' } }, 404)));
    assert.equal(j.name, 'FileNotFoundError');
    assert.equal(j.code, 'FILE_NOT_FOUND');
    assert.equal(j.httpStatus, 404);
    assert.deepEqual(j.context, { path: '/p' });
  });
});

describe('retries', () => {
  it('retries network errors and 503 SHARD_UNAVAILABLE with one Idempotency-Key', async () => {
    const srv = await fakeServer((req, res, n) => {
      if (n === 1) return req.socket.destroy(); // connection dropped before the reply
      if (n === 2) return json(res, 503, { code: 'SHARD_UNAVAILABLE', message: 'shard s0 unavailable', context: {}, httpStatus: 503 });
      json(res, 200, { success: true, exitCode: 0, stdout: 'ok\n', stderr: '', duration: 1 });
    });
    const client = new SbxClient({ url: srv.url, retry: { retries: 4, minDelayMs: 10, maxDelayMs: 50 } });
    try {
      const r = await getSandbox(client, 'retry-box').exec('echo ok');
      assert.equal(r.stdout, 'ok\n');
      assert.equal(srv.seen.length, 3);
      const keys = srv.seen.map((s) => s.headers['idempotency-key']);
      assert.match(keys[0], /^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/);
      assert.deepEqual(keys, [keys[0], keys[0], keys[0]]);
      assert.equal(srv.seen[0].url, '/v1/sandboxes/retry-box/exec');
      assert.deepEqual(JSON.parse(srv.seen[0].body), { command: 'echo ok' });
      // A new call gets a new key.
      await getSandbox(client, 'retry-box').exec('echo ok');
      assert.notEqual(srv.seen[3].headers['idempotency-key'], keys[0]);
    } finally {
      client.close();
      await srv.close();
    }
  });

  it('keeps an unknown outcome when a retry is refused (issue 11)', async () => {
    // The first attempt may have run (503 SHARD_UNAVAILABLE); its retry with
    // the same key is refused (WRONG_OWNER): the request's outcome is still
    // unknown, so the client must not report the refusal as the outcome.
    const srv = await fakeServer((req, res, n) => {
      if (n === 1) return json(res, 503, { code: 'SHARD_UNAVAILABLE', message: 'shard s0 fenced', context: {}, httpStatus: 503 });
      json(res, 409, { code: 'WRONG_OWNER', message: 'partition moved', context: {}, httpStatus: 409 });
    });
    const client = new SbxClient({ url: srv.url, retry: { retries: 3, minDelayMs: 5, maxDelayMs: 10 } });
    try {
      await assert.rejects(getSandbox(client, 'x').exec('true'), (err) => {
        assert.ok(err instanceof ShardUnavailableError, `got ${err?.code}`);
        assert.match(err.message, /WRONG_OWNER/);
        return true;
      });
      assert.equal(srv.seen.length, 2);
      // The retry says an earlier attempt may have run (X-Sbx-Retry), with
      // the same key; the first attempt does not.
      assert.equal(srv.seen[0].headers['x-sbx-retry'], undefined);
      assert.equal(srv.seen[1].headers['x-sbx-retry'], '1');
      assert.equal(srv.seen[1].headers['idempotency-key'], srv.seen[0].headers['idempotency-key']);
    } finally {
      client.close();
      await srv.close();
    }
  });

  it('reports the retry\'s answer after a 503 that says ran: false', async () => {
    // The gateway could not deliver the first attempt (its shard was still
    // connecting): context ran false, nothing ran, so the retry's
    // SANDBOX_NOT_FOUND is the request's own outcome (a fresh-clone CI run
    // got ShardUnavailableError "outcome unknown" from status() here).
    const srv = await fakeServer((req, res, n) => {
      if (n === 1) return json(res, 503, { code: 'SHARD_UNAVAILABLE', message: 'shard s1 is unavailable (Connection refused)', context: { ran: false }, httpStatus: 503 });
      json(res, 404, { code: 'SANDBOX_NOT_FOUND', message: "sandbox 'x' does not exist", context: {}, httpStatus: 404 });
    });
    const client = new SbxClient({ url: srv.url, retry: { retries: 3, minDelayMs: 5, maxDelayMs: 10 } });
    try {
      await assert.rejects(getSandbox(client, 'x').status(), SandboxNotFoundError);
      assert.equal(srv.seen.length, 2);
      assert.equal(srv.seen[1].headers['x-sbx-retry'], undefined, 'a retry after ran: false is not marked');
    } finally {
      client.close();
      await srv.close();
    }
  });

  it('does not retry other errors, and gives up after the retry budget', async () => {
    const srv = await fakeServer((req, res) =>
      json(res, 503, { code: 'CONTAINER_UNAVAILABLE', message: 'could not start', context: { sandboxId: 'x' }, httpStatus: 503, operation: 'exec' }),
    );
    const client = new SbxClient({ url: srv.url, retry: { retries: 3, minDelayMs: 5, maxDelayMs: 10 } });
    try {
      await assert.rejects(getSandbox(client, 'x').exec('true'), ContainerUnavailableError);
      assert.equal(srv.seen.length, 1);
    } finally {
      client.close();
      await srv.close();
    }

    const down = await fakeServer((req, res) => json(res, 503, { code: 'SHARD_UNAVAILABLE', message: 'down', context: {} }));
    const c2 = new SbxClient({ url: down.url, retry: { retries: 2, minDelayMs: 5, maxDelayMs: 10 } });
    try {
      await assert.rejects(getSandbox(c2, 'x').exec('true'), ShardUnavailableError);
      assert.equal(down.seen.length, 3);
    } finally {
      c2.close();
      await down.close();
    }

    // Nothing listening: GatewayUnavailableError after the retries.
    const port = down.url.split(':').pop();
    const c3 = new SbxClient({ url: `http://127.0.0.1:${port}`, retry: { retries: 2, minDelayMs: 5, maxDelayMs: 10 } });
    await assert.rejects(getSandbox(c3, 'x').exec('true'), (err) => {
      assert.ok(err instanceof GatewayUnavailableError);
      assert.equal(err.code, 'GATEWAY_UNAVAILABLE');
      assert.equal(err.cause.code, 'ECONNREFUSED');
      return true;
    });
    c3.close();
  });

  it('sends X-Sbx-Client, which the keyless server requires of mutating calls', async () => {
    const srv = await fakeServer((req, res) => json(res, 200, { success: true, exitCode: 0, stdout: '', stderr: '' }));
    const client = new SbxClient({ url: srv.url });
    try {
      await getSandbox(client, 'hdr').exec('true');
      assert.equal(srv.seen[0].method, 'POST');
      assert.match(srv.seen[0].headers['x-sbx-client'] ?? '', /^sbx-sandbox-typescript\//);
    } finally {
      client.close();
      await srv.close();
    }
    // And the real keyless front refuses a mutating call without it.
    const res = await fetch(`${ctx.client.url}/v1/sandboxes/${ctx.newId('hdr').toLowerCase()}/exec`, {
      method: 'POST', body: JSON.stringify({ command: 'true' }),
    });
    assert.equal(res.status, 403);
    assert.equal((await res.json()).code, 'PERMISSION_DENIED');
  });

  it('sends the API key and reads SBX_URL / SBX_API_KEY', async () => {
    const srv = await fakeServer((req, res) => json(res, 200, { ok: true }));
    const saved = [process.env.SBX_URL, process.env.SBX_API_KEY];
    process.env.SBX_URL = srv.url;
    process.env.SBX_API_KEY = 'k'.repeat(20);
    try {
      const client = new SbxClient();
      assert.equal(client.url, srv.url);
      assert.deepEqual(await client.health(), { ok: true });
      assert.equal(srv.seen[0].headers.authorization, `Bearer ${'k'.repeat(20)}`);
      client.close();
      const explicit = new SbxClient({ url: srv.url, apiKey: 'other-key-0123456789' });
      await explicit.health();
      assert.equal(srv.seen[1].headers.authorization, 'Bearer other-key-0123456789');
      // The key never goes into a URL: a minted URL token does (issue 16).
      assert.doesNotMatch(getSandbox(explicit, 'abc').terminalUrl(), /access_token|other-key/);
      explicit.close();
    } finally {
      [process.env.SBX_URL, process.env.SBX_API_KEY] = saved;
      if (saved[0] === undefined) delete process.env.SBX_URL;
      if (saved[1] === undefined) delete process.env.SBX_API_KEY;
      await srv.close();
    }
    delete process.env.SBX_URL;
    assert.equal(new SbxClient().url, 'http://127.0.0.1:7780');
    if (saved[0] !== undefined) process.env.SBX_URL = saved[0];
  });

  it('puts a minted URL token, never the key, into a terminal URL (issue 16)', async () => {
    const srv = await fakeServer((req, res) => json(res, 200, { token: 'ut1.123.abc', purpose: 'terminal', sandbox: 'abc', expiresAt: 123, ttlMs: 60000 }));
    try {
      const client = new SbxClient({ url: srv.url, apiKey: 'secret-key-0123456789' });
      const u = await getSandbox(client, 'abc').terminalUrlWithToken('tty', { cols: 80 });
      assert.equal(srv.seen.length, 1);
      assert.equal(srv.seen[0].method, 'POST');
      assert.equal(srv.seen[0].url, '/v1/sandboxes/abc/url-token?purpose=terminal');
      assert.equal(srv.seen[0].headers.authorization, 'Bearer secret-key-0123456789');
      assert.match(u, /^ws:\/\/.*\/v1\/sandboxes\/abc\/terminal\?session=tty&cols=80&access_token=ut1\.123\.abc$/);
      assert.doesNotMatch(u, /secret-key/);
      client.close();
      // Without a key there is nothing to mint (a keyless server needs none).
      const keyless = new SbxClient({ url: srv.url });
      assert.doesNotMatch(await getSandbox(keyless, 'abc').terminalUrlWithToken(), /access_token/);
      assert.equal(srv.seen.length, 1);
      keyless.close();
    } finally {
      await srv.close();
    }
  });
});

describe('sandbox lifecycle', () => {
  it('creates on first use, reports status, destroys', async () => {
    assert.deepEqual(await ctx.client.health(), { ok: true });
    const id = ctx.newId('Life').toLowerCase();
    const sb = getSandbox(ctx.client, id.toUpperCase(), { normalizeId: true });
    assert.equal(sb.id, id);
    await assert.rejects(sb.status(), SandboxNotFoundError);
    await sb.exec('true');
    const st = await sb.status();
    assert.equal(st.state, 'running');
    assert.ok((await ctx.client.listSandboxes()).sandboxes.some((s) => s.id === id));
    await sb.writeFile('/workspace/keep.txt', 'x');
    const d = await sb.destroy();
    assert.equal(d.destroyed, true);
    assert.equal((await sb.destroy()).destroyed, false);
    await assert.rejects(sb.status(), SandboxNotFoundError);
    // A later operation makes a new, empty sandbox.
    await assert.rejects(sb.readFile('/workspace/keep.txt'), FileNotFoundError);
  });

  it('answers a retried request from the cache (same Idempotency-Key)', async () => {
    const sb = ctx.sandbox('idem');
    const key = crypto.randomUUID();
    const send = () =>
      ctx.client.requestJson({
        method: 'POST',
        path: `/v1/sandboxes/${sb.id}/exec`,
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ command: 'echo $RANDOM$RANDOM' }),
        idempotencyKey: key,
      });
    const a = await send();
    const b = await send();
    assert.equal(a.stdout, b.stdout, 'the command ran once');
  });

  it('rejects invalid sandbox IDs with ValidationFailedError', async () => {
    await assert.rejects(getSandbox(ctx.client, 'Bad_ID!').exec('true'), (err) => {
      assert.ok(err instanceof ValidationFailedError);
      assert.equal(err.httpStatus, 400);
      return true;
    });
  });
});
