// Terminals over WebSocket.
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';

import { Terminal } from '../dist/index.js';
import { useDaemon } from './helpers.mjs';

const ctx = useDaemon();

describe('terminal', () => {
  it('types a command, sees its output, resizes, and gets the exit code', async () => {
    const sb = ctx.sandbox('term');
    const term = await sb.terminal(undefined, { cols: 100, rows: 30 });
    assert.ok(term instanceof Terminal);
    assert.equal(term.sessionId, 'default');
    const events = [];
    term.on('ready', () => events.push('ready'));
    await term.ready;
    term.write('echo $((6*7))\n');
    const out = await term.waitFor(/42\r\n/, 15_000); // the echoed command line holds no 42
    assert.match(out, /42/);

    term.resize(120, 40);
    term.write(new TextEncoder().encode('stty size\n'));
    await term.waitFor('40 120', 15_000);

    // Output is also an async iterable of byte chunks.
    const chunks = [];
    const reading = (async () => {
      for await (const c of term) chunks.push(c);
    })();
    term.write('exit 7\n');
    const exit = await term.exited;
    assert.deepEqual(exit, { code: 7 });
    await term.closed;
    await reading;
    assert.ok(chunks.every((c) => c instanceof Uint8Array));
  });

  it('belongs to a session and replays recent output on reconnect', async () => {
    const sb = ctx.sandbox('termsess');
    const s = await sb.createSession({ id: 'tty', cwd: '/tmp' });
    const t1 = await s.terminal();
    assert.equal(t1.sessionId, 'tty');
    await t1.ready;
    t1.write('pwd; echo marker-$((1+2))\n');
    await t1.waitFor('marker-3');
    await t1.close();

    const t2 = await s.terminal();
    await t2.ready;
    assert.match(t2.output, /marker-3/, 'the replay holds earlier output');
    t2.write('exit\n');
    assert.equal((await t2.exited).code, 0);

    assert.match(sb.terminalUrl('tty', { cols: 80 }), /^ws:\/\/.*\/terminal\?session=tty&cols=80$/);
  });
});
