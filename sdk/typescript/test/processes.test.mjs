// Background processes.
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';

import {
  isProcess,
  Process,
  ProcessExitedBeforeReadyError,
  ProcessNotFoundError,
  ProcessReadyTimeoutError,
  ResourceBusyError,
} from '../dist/index.js';
import { useDaemon } from './helpers.mjs';

const ctx = useDaemon();

describe('processes', () => {
  it('start, wait for a log line and a port, then kill', async () => {
    const sb = ctx.sandbox('proc');
    const proc = await sb.startProcess('python3 -u -m http.server 8765 --bind 127.0.0.1', { processId: 'web' });
    assert.ok(isProcess(proc));
    assert.ok(proc instanceof Process);
    assert.equal(proc.id, 'web');
    assert.equal(proc.status, 'running');
    assert.equal(typeof proc.pid, 'number');
    assert.ok(proc.startTime instanceof Date);

    const log = await proc.waitForLog('Serving HTTP', 20_000);
    assert.match(log.line, /Serving HTTP on 127\.0\.0\.1 port 8765/);
    const re = await proc.waitForLog(/port (\d+)/, 20_000);
    assert.equal(re.match[1], '8765');
    const port = await proc.waitForPort(8765, { timeout: 20_000 });
    assert.equal(port.ready, true);
    assert.equal(port.statusCode, 200);
    const tcp = await proc.waitForPort(8765, { mode: 'tcp', timeout: 5_000 });
    assert.equal(tcp.ready, true);

    const got = await sb.exec('curl -s -o /dev/null -w "%{http_code}" http://127.0.0.1:8765/ || python3 -c "import urllib.request;print(urllib.request.urlopen(\'http://127.0.0.1:8765/\').status,end=\'\')"');
    assert.equal(got.stdout.trim(), '200');

    assert.equal(await proc.getStatus(), 'running');
    const listed = await sb.listProcesses();
    assert.ok(listed.some((p) => p.id === 'web' && p.status === 'running'));
    await assert.rejects(sb.startProcess('sleep 1', { processId: 'web' }), ResourceBusyError);

    await proc.kill();
    assert.equal(proc.status, 'killed');
    const after = await sb.getProcess('web');
    assert.equal(after.status, 'killed');
    assert.ok([137, 143].includes(after.exitCode));
    assert.ok(after.endTime instanceof Date);
    const logs = await proc.getLogs();
    assert.match(logs.stderr + logs.stdout, /GET \/ HTTP/);
  });

  it('streams logs, waits for exit, and reports unknown processes', async () => {
    const sb = ctx.sandbox('plogs');
    const outputs = [];
    let exitCode;
    let resolveExit;
    const exited = new Promise((resolve) => (resolveExit = resolve));
    const proc = await sb.startProcess('for i in 1 2 3; do echo tick $i; sleep 0.1; done; echo bye >&2; exit 3', {
      processId: 'ticker',
      onOutput: (stream, data) => outputs.push([stream, data]),
      onExit: (code) => {
        exitCode = code;
        resolveExit();
      },
    });
    const res = await proc.waitForExit(20_000);
    assert.equal(res.exitCode, 3);
    assert.equal(res.status, 'failed');
    await exited;
    assert.equal(exitCode, 3);
    assert.equal(outputs.filter(([s]) => s === 'stdout').map(([, d]) => d).join(''), 'tick 1\ntick 2\ntick 3\n');

    const events = await (await sb.streamProcessLogs('ticker')).toArray();
    assert.equal(events[0].type, 'process_info');
    assert.equal(events.at(-1).type, 'exit');
    assert.equal(events.at(-1).exitCode, 3);
    const logs = await sb.getProcessLogs('ticker');
    assert.equal(logs.stdout, 'tick 1\ntick 2\ntick 3\n');
    assert.equal(logs.stderr, 'bye\n');

    assert.equal(await sb.getProcess('no-such-process'), null);
    await assert.rejects(sb.killProcess('no-such-process'), (err) => {
      assert.ok(err instanceof ProcessNotFoundError);
      assert.equal(err.httpStatus, 404);
      return true;
    });
  });

  it('fails readiness waits with ProcessReadyTimeoutError and ProcessExitedBeforeReadyError', async () => {
    const sb = ctx.sandbox('pready');
    const quiet = await sb.startProcess('sleep 30', { processId: 'quiet' });
    await assert.rejects(quiet.waitForLog('never printed', 300), (err) => {
      assert.ok(err instanceof ProcessReadyTimeoutError);
      assert.equal(err.code, 'PROCESS_READY_TIMEOUT');
      assert.equal(err.httpStatus, 408);
      return true;
    });
    await assert.rejects(quiet.waitForLog(/never.*printed/, 300), ProcessReadyTimeoutError);
    await assert.rejects(quiet.waitForPort(8799, { mode: 'tcp', timeout: 300 }), ProcessReadyTimeoutError);

    const brief = await sb.startProcess('echo short-lived; exit 2', { processId: 'brief' });
    await assert.rejects(brief.waitForLog('not there', 10_000), ProcessExitedBeforeReadyError);
    await assert.rejects(brief.waitForLog(/not there/, 10_000), ProcessExitedBeforeReadyError);
    // Already printed lines are found after the process ended.
    assert.equal((await brief.waitForLog(/short-(\w+)/, 10_000)).match[1], 'lived');

    const killed = await sb.killAllProcesses();
    assert.ok(killed >= 1);
    assert.equal(await quiet.getStatus(), 'killed');
  });
});
