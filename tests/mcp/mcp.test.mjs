// `sbx mcp` with the official MCP TypeScript SDK as the client (tests/mcp/run-tests.sh):
// the handshake, the tool list and its input schemas (from the operation schema),
// each tool called on a real sandbox of a private `sbxd dev`, and errors as MCP
// tool errors (isError) or, for an unknown tool, a JSON-RPC error.
import { spawn, spawnSync } from 'node:child_process';
import assert from 'node:assert/strict';
import { closeSync, existsSync, mkdtempSync, openSync, readFileSync, rmSync } from 'node:fs';
import path from 'node:path';
import { after, before, test } from 'node:test';

import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js';
import { McpError } from '@modelcontextprotocol/sdk/types.js';

const bin = path.resolve(process.env.SBX_BIN);
const mark = /^[a-z0-9]{1,8}$/.test(process.env.SBX_TEST_PREFIX ?? '') ? process.env.SBX_TEST_PREFIX : '';
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const sandbox = `mcp-${mark}${process.pid}`;

let dataDir, daemon, gateway, client;

before(async () => {
  dataDir = mkdtempSync(`/tmp/sbx-mcp-${mark}`);
  gateway = `ipc://${dataDir}/gw.sock`;
  const name = 'mcp' + mark + Math.random().toString(36).slice(2, 10).replace(/[^a-z]/g, 'x');
  const fd = openSync(path.join(dataDir, 'sbxd.log'), 'a');
  daemon = spawn(path.join(bin, 'sbxd'),
    ['dev', '--data', dataDir, '--listen', gateway, '--name', name, '--shards', '1',
     '--http', '127.0.0.1:0', '--pool', '0'], { stdio: ['ignore', fd, fd] });
  closeSync(fd);
  // Ready when the gateway answers and every shard is healthy.
  const ready = () => {
    const st = spawnSync(path.join(bin, 'sbx'), ['--gateway', gateway, '--json', 'cluster', 'status']);
    try {
      const shards = JSON.parse(st.stdout.toString()).shards;
      return st.status === 0 && shards.length > 0 && shards.every((s) => s.health === 'ok');
    } catch {
      return false;
    }
  };
  for (let i = 0; ; i++) {
    if (ready()) break;
    if (i > 300 || daemon.exitCode !== null) {
      throw new Error('sbxd did not come up:\n' + readFileSync(path.join(dataDir, 'sbxd.log'), 'utf8').slice(-2000));
    }
    await sleep(100);
  }
  client = new Client({ name: 'sbx-mcp-test', version: '1.0.0' });
  await client.connect(new StdioClientTransport({
    command: path.join(bin, 'sbx'), args: ['--gateway', gateway, 'mcp'], stderr: 'inherit',
  }));
});

after(async () => {
  if (client) await client.close();
  if (daemon && daemon.exitCode === null) {
    const gone = new Promise((r) => daemon.once('exit', r));
    daemon.kill('SIGTERM');
    const t = setTimeout(() => daemon.kill('SIGKILL'), 20000);
    await gone;
    clearTimeout(t);
  }
  if (dataDir && existsSync(dataDir)) rmSync(dataDir, { recursive: true, force: true });
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
