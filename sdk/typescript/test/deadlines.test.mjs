// Deadlines (issue 11): a call settles by its timeoutMs (+ 1 s of slack)
// whatever the server does — never answering, a reply cut short, a stopped
// daemon, 503s that would be retried past the deadline, a server that goes
// away. The rule is documented on SbxClientOptions.timeoutMs.
import assert from 'node:assert/strict';
import { readdirSync, readFileSync } from 'node:fs';
import http from 'node:http';
import net from 'node:net';
import { describe, it } from 'node:test';

import { getSandbox, SandboxError, SbxClient } from '../dist/index.js';
import { startDaemon } from './helpers.mjs';

const SLACK_MS = 1000;

/** A loopback TCP server whose connections are accepted and never answered. */
async function silentServer() {
  const sockets = new Set();
  const server = net.createServer((s) => {
    sockets.add(s);
    s.on('error', () => {});
    s.on('close', () => sockets.delete(s));
  });
  await new Promise((r) => server.listen(0, '127.0.0.1', r));
  return {
    url: `http://127.0.0.1:${server.address().port}`,
    close: () => {
      for (const s of sockets) s.destroy();
      return new Promise((r) => server.close(r));
    },
  };
}

/** A loopback HTTP server answering every request with `handler(req, res)`. */
async function httpServer(handler) {
  const sockets = new Set();
  const server = http.createServer(handler);
  server.on('connection', (s) => {
    sockets.add(s);
    s.on('close', () => sockets.delete(s));
  });
  await new Promise((r) => server.listen(0, '127.0.0.1', r));
  return {
    url: `http://127.0.0.1:${server.address().port}`,
    close: () => {
      for (const s of sockets) s.destroy();
      return new Promise((r) => server.close(r));
    },
  };
}

/** Wait until every thread of `pid` is stopped: kill() returns before a running thread has taken its SIGSTOP. */
async function waitStopped(pid) {
  const end = Date.now() + 10_000;
  while (Date.now() < end) {
    const states = [];
    for (const t of readdirSync(`/proc/${pid}/task`)) {
      try {
        states.push(readFileSync(`/proc/${pid}/task/${t}/stat`, 'utf8').split(')').pop().trim().split(' ')[0]);
      } catch {
        // the thread ended
      }
    }
    if (states.length && states.every((s) => s === 'T' || s === 't')) return;
    await new Promise((r) => setTimeout(r, 10));
  }
  assert.fail(`process ${pid} did not stop`);
}

/** Run `fn`, expect it to reject; returns {err, took} (ms). */
async function timed(fn) {
  const t0 = performance.now();
  try {
    await fn();
  } catch (err) {
    return { err, took: performance.now() - t0 };
  }
  assert.fail('the call succeeded');
}

describe('deadlines', () => {
  it('a server that never answers is REQUEST_TIMEOUT by the deadline', async () => {
    const srv = await silentServer();
    const client = new SbxClient({ url: srv.url, timeoutMs: 1000 });
    try {
      const { err, took } = await timed(() => client.call('dl-silent', 'ping'));
      assert.ok(err instanceof SandboxError, String(err));
      assert.equal(err.code, 'REQUEST_TIMEOUT');
      assert.ok(took < 1000 + SLACK_MS, `settled after ${took.toFixed(0)} ms (deadline 1000)`);
    } finally {
      client.close();
      await srv.close();
    }
  });

  it('a reply cut short after its headers is REQUEST_TIMEOUT by the deadline', async () => {
    const srv = await httpServer((req, res) => {
      res.writeHead(200, { 'content-type': 'application/json', 'content-length': '100' });
      res.write('{"ok":'); // and nothing more
    });
    const client = new SbxClient({ url: srv.url, timeoutMs: 1000 });
    try {
      const { err, took } = await timed(() => client.call('dl-half', 'ping'));
      assert.equal(err.code, 'REQUEST_TIMEOUT', String(err));
      assert.ok(took < 1000 + SLACK_MS, `settled after ${took.toFixed(0)} ms (deadline 1000)`);
    } finally {
      client.close();
      await srv.close();
    }
  });

  it('503 SHARD_UNAVAILABLE is not retried past the deadline', async () => {
    // Each answer comes after 600 ms: five retries would take over 3 s.
    const srv = await httpServer((req, res) => {
      req.resume();
      setTimeout(() => {
        res.writeHead(503, { 'content-type': 'application/json' });
        res.end(JSON.stringify({ code: 'SHARD_UNAVAILABLE', message: 'shard s0 did not answer' }));
      }, 600);
    });
    const client = new SbxClient({ url: srv.url, timeoutMs: 1500, retry: { retries: 5, minDelayMs: 50, maxDelayMs: 100 } });
    try {
      const { err, took } = await timed(() => client.call('dl-503', 'ping'));
      assert.ok(['SHARD_UNAVAILABLE', 'REQUEST_TIMEOUT'].includes(err.code), String(err));
      assert.ok(took < 1500 + SLACK_MS, `settled after ${took.toFixed(0)} ms (deadline 1500)`);
    } finally {
      client.close();
      await srv.close();
    }
  });

  it('a server that goes away is not retried past the deadline', async () => {
    const srv = await silentServer();
    const url = srv.url;
    await srv.close(); // nothing listens there any more: every attempt is refused
    const client = new SbxClient({ url, timeoutMs: 1000, retry: { retries: 10, minDelayMs: 300, maxDelayMs: 3000 } });
    try {
      const { err, took } = await timed(() => client.call('dl-gone', 'ping'));
      assert.ok(['GATEWAY_UNAVAILABLE', 'REQUEST_TIMEOUT'].includes(err.code), String(err));
      assert.ok(took < 1000 + SLACK_MS, `settled after ${took.toFixed(0)} ms (deadline 1000)`);
    } finally {
      client.close();
    }
  });

  it('a stopped shard is SHARD_UNAVAILABLE by the deadline', async () => {
    const d = await startDaemon();
    const client = new SbxClient({ url: d.url, timeoutMs: 2000 });
    let shardPid = 0;
    try {
      const id = `ts-dl-${process.pid}-shard`;
      const sb = getSandbox(client, id);
      await client.call(id, 'exec', { command: 'true' }, { timeoutMs: 60_000 });
      const st = await client.call(id, 'status', {}, { timeoutMs: 60_000 });
      // A deadline the server cannot take is a clear 400, not a default.
      for (const bad of ['abc', '0', '-5', '1.5', '90000001']) {
        const r = await fetch(`${d.url}/v1/sandboxes/${id}/ping`, { method: 'POST', headers: { 'x-sbx-client': 'test', 'x-sbx-timeout-ms': bad } });
        assert.equal(r.status, 400, `X-Sbx-Timeout-Ms: ${bad}`);
        assert.equal((await r.json()).code, 'VALIDATION_FAILED', `X-Sbx-Timeout-Ms: ${bad}`);
      }
      const cs = await client.clusterStatus();
      shardPid = cs.shards.find((s) => s.name === st.sandbox.shard)?.status?.pid ?? 0;
      assert.ok(shardPid > 0, `no pid for shard ${st.sandbox.shard}`);
      process.kill(shardPid, 'SIGSTOP');
      await waitStopped(shardPid);
      const { err, took } = await timed(() => client.call(id, 'ping'));
      assert.equal(err.code, 'SHARD_UNAVAILABLE', String(err));
      assert.ok(took < 2000 + SLACK_MS, `settled after ${took.toFixed(0)} ms (deadline 2000)`);
      process.kill(shardPid, 'SIGCONT');
      shardPid = 0;
      await sb.destroy();
    } finally {
      if (shardPid) process.kill(shardPid, 'SIGCONT');
      client.close();
      await d.stop();
    }
  });

  it('a stopped daemon is REQUEST_TIMEOUT by the deadline', async () => {
    const d = await startDaemon();
    const client = new SbxClient({ url: d.url, timeoutMs: 1500 });
    let stopped = false;
    try {
      process.kill(d.pid, 'SIGSTOP');
      stopped = true;
      await waitStopped(d.pid);
      const { err, took } = await timed(() => client.call(`ts-dl-${process.pid}`, 'ping'));
      assert.equal(err.code, 'REQUEST_TIMEOUT', String(err));
      assert.ok(took < 1500 + SLACK_MS, `settled after ${took.toFixed(0)} ms (deadline 1500)`);
      // A stream open is bounded the same way.
      const t0 = performance.now();
      await assert.rejects(
        async () => {
          const s = await getSandbox(client, `ts-dl-${process.pid}`).execStream('echo hi');
          for await (const ev of s) void ev;
        },
        (e) => ['REQUEST_TIMEOUT', 'GATEWAY_UNAVAILABLE'].includes(e.code),
      );
      const took2 = performance.now() - t0;
      assert.ok(took2 < 1500 + SLACK_MS, `the stream settled after ${took2.toFixed(0)} ms (deadline 1500)`);
    } finally {
      if (stopped) process.kill(d.pid, 'SIGCONT');
      client.close();
      await d.stop();
    }
  });
});
