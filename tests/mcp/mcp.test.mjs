// `sbx mcp` (stdio) and MCP over streamable HTTP on the gateway's front (/mcp),
// each with the official MCP TypeScript SDK as the client (tests/mcp/run-tests.sh):
// the handshake, the tool list and its input schemas (from the operation schema),
// each tool called on a real sandbox of a private `sbxd dev`, progress, cancellation,
// and errors as MCP tool errors (isError) or, for an unknown tool, a JSON-RPC error;
// then what only HTTP has: sessions, keys (a bad key refused), the Origin check.
import { spawn, spawnSync } from 'node:child_process';
import assert from 'node:assert/strict';
import { closeSync, existsSync, mkdtempSync, openSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';

import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { McpError } from '@modelcontextprotocol/sdk/types.js';

const bin = path.resolve(process.env.SBX_BIN);
const mark = /^[a-z0-9]{1,8}$/.test(process.env.SBX_TEST_PREFIX ?? '') ? process.env.SBX_TEST_PREFIX : '';
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const daemons = [];

/** A private `sbxd dev` (extra: more arguments; key: its API key, if it has keys);
 * {dataDir, gateway, http, proc} once ready. */
async function startDaemon(extra = [], key = '') {
  const dataDir = mkdtempSync(`/tmp/sbx-mcp-${mark}`);
  const gateway = `ipc://${dataDir}/gw.sock`;
  const name = 'mcp' + mark + Math.random().toString(36).slice(2, 10).replace(/[^a-z]/g, 'x');
  const fd = openSync(path.join(dataDir, 'sbxd.log'), 'a');
  const proc = spawn(path.join(bin, 'sbxd'),
    ['dev', '--data', dataDir, '--listen', gateway, '--name', name, '--shards', '1',
     '--http', '127.0.0.1:0', '--pool', '0', ...extra], { stdio: ['ignore', fd, fd] });
  closeSync(fd);
  const d = { dataDir, gateway, proc };
  daemons.push(d);
  // Ready when the gateway answers, every shard is healthy and the front wrote its address.
  const ready = () => {
    const env = key ? { ...process.env, SBX_API_KEY: key } : process.env;
    const st = spawnSync(path.join(bin, 'sbx'), ['--gateway', gateway, '--json', 'cluster', 'status'], { env });
    try {
      const shards = JSON.parse(st.stdout.toString()).shards;
      return st.status === 0 && shards.length > 0 && shards.every((s) => s.health === 'ok') &&
             existsSync(path.join(dataDir, 'http.addr'));
    } catch {
      return false;
    }
  };
  for (let i = 0; ; i++) {
    if (ready()) break;
    if (i > 300 || proc.exitCode !== null) {
      throw new Error('sbxd did not come up:\n' + readFileSync(path.join(dataDir, 'sbxd.log'), 'utf8').slice(-2000));
    }
    await sleep(100);
  }
  d.http = 'http://' + readFileSync(path.join(dataDir, 'http.addr'), 'utf8').trim().replace(/^http:\/\//, '');
  return d;
}

let dev;

before(async () => {
  dev = await startDaemon();
});

after(async () => {
  for (const d of daemons) {
    if (d.proc.exitCode === null) {
      const gone = new Promise((r) => d.proc.once('exit', r));
      d.proc.kill('SIGTERM');
      const t = setTimeout(() => d.proc.kill('SIGKILL'), 20000);
      await gone;
      clearTimeout(t);
    }
    if (existsSync(d.dataDir)) rmSync(d.dataDir, { recursive: true, force: true });
  }
});

const transports = {
  stdio: () => new StdioClientTransport({
    command: path.join(bin, 'sbx'), args: ['--gateway', dev.gateway, 'mcp'], stderr: 'inherit',
  }),
  http: () => new StreamableHTTPClientTransport(new URL(`${dev.http}/mcp`)),
};

for (const [kind, transport] of Object.entries(transports)) describe(`MCP over ${kind}`, () => {
const sandbox = `mcp-${kind}-${mark}${process.pid}`;
let client;

before(async () => {
  client = new Client({ name: 'sbx-mcp-test', version: '1.0.0' });
  await client.connect(transport());
});

after(async () => {
  if (client) await client.close();
});

const call = (name, args) => client.callTool({ name, arguments: args });
const text = (r) => r.content.filter((c) => c.type === 'text').map((c) => c.text).join('\n');

test('handshake: the server names itself and offers tools', () => {
  assert.equal(client.getServerVersion().name, 'sbx');
  assert.ok(client.getServerCapabilities().tools);
});

test('tools/list: every tool, input schemas from the operation schema', async () => {
  const { tools } = await client.listTools();
  const names = tools.map((t) => t.name).sort();
  assert.deepEqual(names, ['exec', 'file_list', 'file_read', 'file_write', 'port_expose',
    'process_start', 'run_code', 'sandbox_create', 'sandbox_destroy', 'sandbox_list']);
  const exec = tools.find((t) => t.name === 'exec');
  assert.equal(exec.inputSchema.type, 'object');
  assert.deepEqual(exec.inputSchema.required, ['sandbox']);
  assert.equal(exec.inputSchema.properties.command.type, 'string');
  assert.equal(exec.inputSchema.properties.timeout.type, 'integer');
  const write = tools.find((t) => t.name === 'file_write');
  assert.deepEqual([...write.inputSchema.required].sort(), ['content', 'path', 'sandbox']);
  assert.equal(write.inputSchema.properties.encoding.type, 'string');
  assert.equal(exec.inputSchema.properties.timeout.maximum, 86400000);
  assert.equal(tools.find((t) => t.name === 'sandbox_list').inputSchema.required, undefined);
});

test('each tool on a real sandbox', async () => {
  let r = await call('sandbox_create', { sandbox });
  assert.equal(r.isError, false, text(r));

  r = await call('exec', { sandbox, command: 'echo hi-$((6 * 7)); echo err >&2; (exit 3)' });
  assert.equal(r.isError, false, text(r));
  assert.equal(r.structuredContent.stdout, 'hi-42\n');
  assert.equal(r.structuredContent.stderr, 'err\n');
  assert.equal(r.structuredContent.exitCode, 3);
  assert.deepEqual(JSON.parse(text(r)).stdout, 'hi-42\n'); // the same result as text

  r = await call('file_write', { sandbox, path: '/workspace/mcp/note.txt', content: 'from mcp\n' });
  assert.equal(r.isError, false, text(r));
  r = await call('file_read', { sandbox, path: '/workspace/mcp/note.txt' });
  assert.equal(r.isError, false, text(r));
  assert.equal(r.structuredContent.content, 'from mcp\n');
  r = await call('file_list', { sandbox, path: '/workspace/mcp' });
  assert.equal(r.isError, false, text(r));
  assert.deepEqual(r.structuredContent.files.map((f) => f.name), ['note.txt']);

  r = await call('run_code', { sandbox, language: 'python', code: 'x = 6 * 7\nprint("printed")\nx' });
  assert.equal(r.isError, false, text(r));
  assert.equal(r.structuredContent.results[0].text, '42');
  assert.deepEqual(r.structuredContent.logs.stdout, ['printed\n']);

  r = await call('run_code', {
    sandbox, language: 'python',
    code: 'import matplotlib\nmatplotlib.use("Agg")\nimport matplotlib.pyplot as plt\n' +
          'plt.plot([1, 2, 3], [1, 4, 9])\nplt.show()',
  });
  assert.equal(r.isError, false, text(r));
  const img = r.content.find((c) => c.type === 'image');
  assert.ok(img, 'a plot comes back as image content: ' + JSON.stringify(r.content).slice(0, 400));
  assert.equal(img.mimeType, 'image/png');
  assert.equal(Buffer.from(img.data, 'base64').subarray(1, 4).toString(), 'PNG');
  assert.ok(!text(r).includes(img.data.slice(0, 100)), 'the image is not repeated in the text');

  r = await call('process_start', { sandbox, command: 'python3 -m http.server 8123 --bind 127.0.0.1' });
  assert.equal(r.isError, false, text(r));
  assert.ok(r.structuredContent.processId);

  r = await call('port_expose', { sandbox, port: 8123 });
  assert.equal(r.isError, false, text(r));
  assert.match(r.structuredContent.url, /^http:\/\/8123-/);

  r = await call('sandbox_list', {});
  assert.equal(r.isError, false, text(r));
  assert.ok(r.structuredContent.sandboxes.some((s) => s.id === sandbox), text(r));

  r = await call('sandbox_destroy', { sandbox });
  assert.equal(r.isError, false, text(r));
});

test('exec reports its output as progress notifications while it runs', async () => {
  const seen = [];
  const r = await client.callTool(
    { name: 'exec', arguments: { sandbox, command: 'for i in 1 2 3; do echo line-$i; sleep 0.3; done' } },
    undefined,
    { onprogress: (p) => seen.push(p) },
  );
  assert.equal(r.isError, false, text(r));
  assert.equal(r.structuredContent.stdout, 'line-1\nline-2\nline-3\n');
  assert.ok(seen.length >= 2, `progress notifications: ${JSON.stringify(seen)}`);
  assert.equal(seen.map((p) => p.message).join(''), 'line-1\nline-2\nline-3\n');
  assert.ok(seen.every((p, i) => i === 0 || p.progress > seen[i - 1].progress), 'progress increases');
});

test('cancelling a long exec stops its command; other calls go on meanwhile', async () => {
  // A duration of its own; the pattern's [.] keeps pgrep's own shell from matching it.
  const dur = `3${process.pid % 1000}.25`;
  const pattern = `sleep ${dur.replace('.', '[.]')}`;
  const ac = new AbortController();
  const long = client.callTool(
    { name: 'exec', arguments: { sandbox, command: `sleep ${dur}` } },
    undefined,
    { signal: ac.signal, timeout: 200000 },
  );
  await sleep(1500);
  // A second call is served while the first one runs.
  const t0 = Date.now();
  const r = await call('exec', { sandbox, command: 'echo meanwhile', sessionless: true });
  assert.equal(r.structuredContent.stdout, 'meanwhile\n');
  assert.ok(Date.now() - t0 < 60000);
  let ps = await call('exec', { sandbox, command: `pgrep -f '${pattern}' || true`, sessionless: true });
  assert.notEqual(ps.structuredContent.stdout.trim(), '', 'the long command runs before the cancel');
  ac.abort();
  await assert.rejects(long);
  // The command is killed: it disappears from the sandbox.
  let gone = false;
  for (let i = 0; i < 50 && !gone; i++) {
    ps = await call('exec', { sandbox, command: `pgrep -f '${pattern}' || true`, sessionless: true });
    gone = ps.structuredContent.stdout.trim() === '';
    if (!gone) await sleep(200);
  }
  assert.ok(gone, 'the cancelled command still runs: ' + ps.structuredContent.stdout);
  // The server still answers.
  assert.equal((await call('exec', { sandbox, command: 'echo after' })).structuredContent.stdout, 'after\n');
});

test('errors are MCP tool errors with the sbx code', async () => {
  let r = await call('exec', { command: 'true' });
  assert.equal(r.isError, true);
  assert.match(text(r), /^VALIDATION_FAILED: /);

  r = await call('exec', { sandbox, command: 42 });
  assert.equal(r.isError, true);
  assert.match(text(r), /^VALIDATION_FAILED: .*command/);

  r = await call('file_read', { sandbox: sandbox + '-e', path: '/no/such/file' });
  assert.equal(r.isError, true);
  assert.match(text(r), /^FILE_NOT_FOUND: /);
  await call('sandbox_destroy', { sandbox: sandbox + '-e' });

  r = await call('sandbox_create', { sandbox: 'Not_A_Valid_Id' });
  assert.equal(r.isError, true);
  assert.match(text(r), /^VALIDATION_FAILED: /);
});

test('an unknown tool is a JSON-RPC invalid-params error', async () => {
  await assert.rejects(call('no_such_tool', {}), (e) => e instanceof McpError && e.code === -32602);
});
});

describe('MCP over HTTP only', () => {
  const init = {
    jsonrpc: '2.0', id: 1, method: 'initialize',
    params: { protocolVersion: '2025-06-18', capabilities: {}, clientInfo: { name: 'raw', version: '1' } },
  };
  const post = (url, body, headers = {}) => fetch(url, {
    method: 'POST', body: JSON.stringify(body),
    headers: { 'Content-Type': 'application/json', Accept: 'application/json, text/event-stream', ...headers },
  });

  test('sessions: initialize opens one, DELETE ends it, then it is unknown (404)', async () => {
    const url = `${dev.http}/mcp`;
    let r = await post(url, init);
    assert.equal(r.status, 200);
    const sid = r.headers.get('mcp-session-id');
    assert.match(sid ?? '', /^[0-9a-f]{32}$/);
    assert.equal((await r.json()).result.serverInfo.name, 'sbx');
    r = await post(url, { jsonrpc: '2.0', id: 2, method: 'tools/list' });
    assert.equal(r.status, 400, 'a request without its session is refused');
    r = await post(url, { jsonrpc: '2.0', id: 2, method: 'tools/list' }, { 'Mcp-Session-Id': sid });
    assert.equal(r.status, 200);
    assert.equal((await r.json()).result.tools.length, 10);
    r = await post(url, { jsonrpc: '2.0', method: 'notifications/initialized' }, { 'Mcp-Session-Id': sid });
    assert.equal(r.status, 202);
    assert.equal((await fetch(url)).status, 405, 'no server-initiated stream: GET is 405');
    r = await fetch(url, { method: 'DELETE', headers: { 'Mcp-Session-Id': sid } });
    assert.equal(r.status, 204);
    r = await post(url, { jsonrpc: '2.0', id: 3, method: 'ping' }, { 'Mcp-Session-Id': sid });
    assert.equal(r.status, 404, 'an ended session is unknown');
  });

  test('keyless: a page of another origin is refused (DNS rebinding), so is a non-JSON POST', async () => {
    const url = `${dev.http}/mcp`;
    let r = await post(url, init, { Origin: 'http://evil.example' });
    assert.equal(r.status, 403);
    r = await fetch(url, { method: 'POST', body: JSON.stringify(init), headers: { 'Content-Type': 'text/plain' } });
    assert.equal(r.status, 415, 'a simple (pre-flight-free) POST is refused');
  });

  test('with API keys: the right key works, a bad or missing key is refused', async () => {
    const key = 'mcp-test-key-' + Math.random().toString(36).slice(2).padEnd(12, 'x');
    const keyfile = path.join(dev.dataDir, 'api-keys');
    writeFileSync(keyfile, key + '\n', { mode: 0o600 });
    const kd = await startDaemon(['--api-keys', keyfile], key);
    const url = new URL(`${kd.http}/mcp`);
    const auth = (k) => ({ requestInit: { headers: { Authorization: `Bearer ${k}` } } });
    const good = new Client({ name: 'sbx-mcp-test', version: '1.0.0' });
    await good.connect(new StreamableHTTPClientTransport(url, auth(key)));
    const sb = `mcp-key-${mark}${process.pid}`;
    const r = await good.callTool({ name: 'exec', arguments: { sandbox: sb, command: 'echo keyed' } });
    assert.equal(r.isError, false, JSON.stringify(r.content));
    assert.equal(r.structuredContent.stdout, 'keyed\n');
    await good.callTool({ name: 'sandbox_destroy', arguments: { sandbox: sb } });
    await good.close();
    const bad = new Client({ name: 'sbx-mcp-test', version: '1.0.0' });
    await assert.rejects(bad.connect(new StreamableHTTPClientTransport(url, auth(key + 'x'))),
                         (e) => e.code === 401 && /UNAUTHORIZED/.test(String(e)), 'a wrong key');
    const none = new Client({ name: 'sbx-mcp-test', version: '1.0.0' });
    await assert.rejects(none.connect(new StreamableHTTPClientTransport(url)),
                         (e) => e.code === 401 && /UNAUTHORIZED/.test(String(e)), 'no key');
  });
});
