// Test helpers: a private sbx daemon, unique sandbox IDs, a cuttable TCP
// proxy and an HTTP helper for preview URLs.
import { spawn, spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, openSync, readFileSync, readdirSync, rmSync, closeSync, statSync } from 'node:fs';
import http from 'node:http';
import net from 'node:net';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { after, before } from 'node:test';

import { SbxClient, getSandbox } from '../dist/index.js';

const here = path.dirname(fileURLToPath(import.meta.url));
export const packageDir = path.resolve(here, '..');

/** The sbxd binary: $SBX_BIN (a directory holding sbxd, or the binary itself), default <repo>/bin. */
export function sbxdPath() {
  const bin = process.env.SBX_BIN ? path.resolve(process.env.SBX_BIN) : path.resolve(packageDir, '../../bin');
  const p = existsSync(bin) && statSync(bin).isDirectory() ? path.join(bin, 'sbxd') : bin;
  if (!existsSync(p)) throw new Error(`sbxd not found at ${p} (set SBX_BIN; build it with make)`);
  return p;
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/**
 * Start `sbxd dev` on a fresh data directory with an HTTP front on a free
 * loopback port. Resolves with {url, dataDir, pid, stop()}.
 */
export async function startDaemon({ log = false } = {}) {
  // The test run's mark (tools/run-tests.sh; tools/leftovers.sh looks for it).
  const mark = /^[a-z0-9]{1,8}$/.test(process.env.SBX_TEST_PREFIX ?? '') ? process.env.SBX_TEST_PREFIX : '';
  const dataDir = mkdtempSync(`/tmp/sbx-ts-${mark}`);
  const name = 'ts' + mark + Math.random().toString(36).slice(2, 10).replace(/[^a-z]/g, 'x');
  const logPath = path.join(dataDir, 'sbxd.log');
  const fd = openSync(logPath, 'a');
  const child = spawn(
    sbxdPath(),
    ['dev', '--data', dataDir, '--listen', `ipc://${dataDir}/gw.sock`, '--name', name, '--http', '127.0.0.1:0', '--pool', '1'],
    { stdio: ['ignore', fd, log ? 'inherit' : fd], detached: false },
  );
  closeSync(fd);
  let exited = null;
  const exitPromise = new Promise((resolve) => child.once('exit', (code, sig) => resolve((exited = { code, sig }))));
  const addrFile = path.join(dataDir, 'http.addr');
  const deadline = Date.now() + 20_000;
  let addr;
  while (Date.now() < deadline) {
    if (exited) break;
    if (existsSync(addrFile)) {
      addr = readFileSync(addrFile, 'utf8').trim();
      if (addr) break;
    }
    await sleep(50);
  }
  const stop = async () => {
    if (!exited) {
      child.kill('SIGTERM');
      const t = setTimeout(() => child.kill('SIGKILL'), 20_000);
      await exitPromise;
      clearTimeout(t);
      // A daemon that did not stop cleanly (a crash at shutdown, or the
      // SIGKILL above) leaves its deploy lock behind and the suite's
      // leftovers check fails: say why here, while its log still exists.
      if (exited && (exited.code !== 0 || exited.sig)) {
        const tail = existsSync(logPath) ? readFileSync(logPath, 'utf8').slice(-4000) : '';
        console.error(`# sbxd dev (pid ${child.pid}) did not stop cleanly: ${JSON.stringify(exited)}\n${tail}`);
      }
    }
    // What a daemon killed without its clean stop left in /run/sbx (its
    // host-lock files, tools/hostlock.c): each one nobody holds goes
    // (flock(1) takes it first, so a live holder's is never touched).
    try {
      for (const f of readdirSync('/run/sbx')) {
        if (f.endsWith('.lock') && f.includes(name))
          spawnSync('flock', ['-n', '-x', path.join('/run/sbx', f), 'rm', '-f', path.join('/run/sbx', f)]);
      }
    } catch {
      // no /run/sbx: nothing was left there
    }
    try {
      rmSync(dataDir, { recursive: true, force: true, maxRetries: 3 });
    } catch (err) {
      console.error(`could not remove ${dataDir}: ${err.message}`);
    }
  };
  if (!addr) {
    const tail = existsSync(logPath) ? readFileSync(logPath, 'utf8').slice(-2000) : '';
    await stop();
    throw new Error(`sbxd did not come up (exit ${JSON.stringify(exited)}):\n${tail}`);
  }
  const url = `http://${addr}`;
  // Wait for the gateway to answer.
  const client = new SbxClient({ url, retry: { retries: 10, minDelayMs: 50, maxDelayMs: 500 } });
  try {
    await client.health();
  } finally {
    client.close();
  }
  return {
    url,
    dataDir,
    pid: child.pid,
    logPath,
    stop,
    /** null while running; {code, sig} once it exited (before stop(): it died). */
    get exited() {
      return exited;
    },
  };
}

/**
 * Per test file: the daemon of the run (SBX_TEST_URL, set by test/run.mjs),
 * else a private one started before the file's tests and stopped after.
 * Returns an object whose fields are filled in `before`.
 */
export function useDaemon() {
  const ctx = { url: undefined, client: undefined, created: new Set() };
  let daemon;
  before(async () => {
    if (process.env.SBX_TEST_URL) ctx.url = process.env.SBX_TEST_URL;
    else {
      daemon = await startDaemon();
      ctx.url = daemon.url;
    }
    ctx.client = new SbxClient({ url: ctx.url });
  });
  after(async () => {
    // Destroy every sandbox the tests made.
    await Promise.allSettled([...ctx.created].map((id) => getSandbox(ctx.client, id).destroy()));
    ctx.client?.close();
    if (daemon) await daemon.stop();
  });
  let n = 0;
  /** A unique sandbox ID (ts-<pid>-<n>[-tag]), destroyed after the file's tests. */
  ctx.newId = (tag = '') => {
    const id = `ts-${process.pid}-${++n}${tag ? '-' + tag : ''}`;
    ctx.created.add(id);
    return id;
  };
  /** A sandbox with a unique ID. */
  ctx.sandbox = (tag, options) => getSandbox(ctx.client, ctx.newId(tag), options);
  return ctx;
}

/**
 * A TCP proxy to `target` (host:port) whose connections can be cut at will,
 * to simulate a dropped network connection.
 */
export async function startProxy(target) {
  const [host, port] = target.replace(/^https?:\/\//, '').split(':');
  const pairs = new Set();
  let connections = 0;
  const server = net.createServer((client) => {
    connections++;
    const upstream = net.connect(Number(port), host);
    const pair = { client, upstream };
    pairs.add(pair);
    client.pipe(upstream);
    upstream.pipe(client);
    const drop = () => {
      pairs.delete(pair);
      client.destroy();
      upstream.destroy();
    };
    client.on('error', drop);
    upstream.on('error', drop);
    client.on('close', drop);
    upstream.on('close', drop);
  });
  await new Promise((r) => server.listen(0, '127.0.0.1', r));
  return {
    url: `http://127.0.0.1:${server.address().port}`,
    get connections() {
      return connections;
    },
    /** Destroy every open connection (both sides). */
    cut() {
      for (const { client, upstream } of pairs) {
        client.destroy();
        upstream.destroy();
      }
      pairs.clear();
    },
    close() {
      this.cut();
      return new Promise((r) => server.close(r));
    },
  };
}

/**
 * GET a preview URL through the daemon's HTTP address, with the URL's host
 * in the Host header (so *.localhost need not resolve).
 */
export function fetchVia(daemonUrl, previewUrl, { method = 'GET', headers = {} } = {}) {
  const d = new URL(daemonUrl);
  const u = new URL(previewUrl);
  return new Promise((resolve, reject) => {
    const req = http.request(
      { host: d.hostname, port: d.port, method, path: u.pathname + u.search, headers: { ...headers, host: u.host }, agent: false },
      (res) => {
        const chunks = [];
        res.on('data', (c) => chunks.push(c));
        res.on('end', () => resolve({ status: res.statusCode, headers: res.headers, body: Buffer.concat(chunks).toString('utf8') }));
        res.on('error', reject);
      },
    );
    req.on('error', reject);
    req.end();
  });
}

export { sleep };
