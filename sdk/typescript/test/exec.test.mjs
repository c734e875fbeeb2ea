// exec, execStream, stream resume and cancel.
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';

import {
  SbxClient,
  getSandbox,
  parseSSEStream,
  SandboxError,
  SessionTerminatedError,
  ValidationFailedError,
  StreamNotFoundError,
  isExecResult,
} from '../dist/index.js';
import { startProxy, useDaemon } from './helpers.mjs';

const ctx = useDaemon();

describe('exec', () => {
  it('returns exit codes, stdout and stderr without throwing on non-zero exits', async () => {
    const sb = ctx.sandbox('exec');
    const ok = await sb.exec('echo hello; echo oops >&2');
    assert.ok(isExecResult(ok));
    assert.equal(ok.success, true);
    assert.equal(ok.exitCode, 0);
    assert.equal(ok.stdout, 'hello\n');
    assert.equal(ok.stderr, 'oops\n');
    assert.equal(ok.command, 'echo hello; echo oops >&2');
    assert.equal(typeof ok.duration, 'number');
    assert.ok(!Number.isNaN(Date.parse(ok.timestamp)));

    const bad = await sb.exec('sh -c "exit 7"');
    assert.equal(bad.success, false);
    assert.equal(bad.exitCode, 7);

    const missing = await sb.exec('definitely-not-a-command-xyz');
    assert.equal(missing.exitCode, 127);
  });

  it('applies env and cwd to one command only, and feeds stdin', async () => {
    const sb = ctx.sandbox('env');
    const r = await sb.exec('echo "$GREETING from $(pwd)"', { env: { GREETING: 'hi there' }, cwd: '/tmp' });
    assert.equal(r.stdout, 'hi there from /tmp\n');
    const after = await sb.exec('echo "[$GREETING] $(pwd)"');
    assert.equal(after.stdout, '[] /workspace\n');
    const cat = await sb.exec('cat | tr a-z A-Z', { stdin: 'piped text' });
    assert.equal(cat.stdout, 'PIPED TEXT');
    const bytes = await sb.exec('wc -c', { stdin: new TextEncoder().encode('héllo') });
    assert.equal(bytes.stdout.trim(), '6');
    const argv = await sb.exec(['printf', '%s|', 'a b', '$HOME']);
    assert.equal(argv.stdout, 'a b|$HOME|');
    await assert.rejects(sb.exec('pwd', { cwd: '/does/not/exist' }), ValidationFailedError);
  });

  it('kills a command at its timeout: exit code 124', async () => {
    const sb = ctx.sandbox('timeout');
    const t0 = Date.now();
    const r = await sb.exec('sleep 30', { timeout: 500 });
    assert.equal(r.exitCode, 124);
    assert.equal(r.success, false);
    assert.equal(r.timedOut, true);
    assert.match(r.stderr, /timed out after 500ms/);
    assert.ok(Date.now() - t0 < 15_000);
    // The session survives the timeout.
    assert.equal((await sb.exec('echo alive')).stdout, 'alive\n');
  });

  it('throws SessionTerminatedError when a command ends its shell', async () => {
    const sb = ctx.sandbox('exit');
    await assert.rejects(sb.exec('echo before; exit 3'), (err) => {
      assert.ok(err instanceof SessionTerminatedError);
      assert.ok(err instanceof SandboxError);
      assert.equal(err.code, 'SESSION_TERMINATED');
      assert.equal(err.httpStatus, 410);
      assert.equal(err.context.exitCode, 3);
      assert.equal(err.context.stdout, 'before\n');
      assert.equal(err.operation, 'exec');
      return true;
    });
    // The next command gets a fresh shell; sessionless commands never end a shell.
    assert.equal((await sb.exec('echo again')).stdout, 'again\n');
    const r = await sb.exec('exit 4', { sessionless: true });
    assert.equal(r.exitCode, 4);
  });

  it('streams output through onOutput with stream: true', async () => {
    const sb = ctx.sandbox('onout');
    const seen = [];
    let completed;
    const r = await sb.exec('echo one; echo two >&2; echo three', {
      stream: true,
      onOutput: (stream, data) => seen.push([stream, data]),
      onComplete: (res) => (completed = res),
    });
    assert.equal(r.exitCode, 0);
    assert.equal(r.stdout, 'one\nthree\n');
    assert.equal(r.stderr, 'two\n');
    assert.equal(seen.filter(([s]) => s === 'stdout').map(([, d]) => d).join(''), 'one\nthree\n');
    assert.equal(seen.filter(([s]) => s === 'stderr').map(([, d]) => d).join(''), 'two\n');
    assert.equal(completed, r);
  });
});

describe('execStream', () => {
  it('yields start, output and complete events in order', async () => {
    const sb = ctx.sandbox('stream');
    const stream = await sb.execStream('for i in 1 2 3; do echo line $i; sleep 0.05; done; echo err >&2');
    assert.match(stream.streamId, /^exec-/);
    const events = [];
    // parseSSEStream accepts the SDK's streams (Cloudflare programs use it).
    for await (const ev of parseSSEStream(stream)) events.push(ev);
    assert.equal(events[0].type, 'start');
    assert.equal(events.at(-1).type, 'complete');
    assert.equal(events.at(-1).exitCode, 0);
    assert.equal(events.at(-1).success, true);
    const seqs = events.map((e) => e.seq);
    assert.deepEqual(seqs, seqs.map((_, i) => i + 1), 'seq 1, 2, 3, … without holes');
    const out = events.filter((e) => e.type === 'stdout').map((e) => e.data).join('');
    assert.equal(out, 'line 1\nline 2\nline 3\n');
    assert.equal(events.filter((e) => e.type === 'stderr').map((e) => e.data).join(''), 'err\n');
    assert.equal(stream.lastEventId, events.length);
    assert.equal(stream.done, true);
  });

  it('resumes with Last-Event-ID after the connection drops mid-stream', async () => {
    const sb0 = ctx.sandbox('resume');
    const proxy = await startProxy(ctx.url);
    const client = new SbxClient({ url: proxy.url, retry: { retries: 6, minDelayMs: 50, maxDelayMs: 400 } });
    try {
      const sb = getSandbox(client, sb0.id);
      // Slow output: nothing is in flight when the connection drops (the next test covers events in flight).
      const stream = await sb.execStream('for i in $(seq 1 6); do echo line $i; sleep 0.5; done');
      const events = [];
      let cutAt;
      for await (const ev of stream) {
        events.push(ev);
        if (ev.type === 'stdout' && cutAt === undefined && ev.data.includes('line 2')) {
          cutAt = ev.seq;
          proxy.cut(); // drop the connection under the SDK
        }
      }
      assert.ok(cutAt, 'the stream was cut');
      assert.ok(stream.reconnects >= 1, 'the stream reconnected');
      assert.ok(proxy.connections >= 2);
      assert.equal(events.at(-1).type, 'complete');
      assert.equal(events.at(-1).exitCode, 0);
      const seqs = events.map((e) => e.seq);
      assert.deepEqual(seqs, seqs.map((_, i) => i + 1), 'every event exactly once, in order');
      const out = events.filter((e) => e.type === 'stdout').map((e) => e.data).join('');
      assert.equal(out, Array.from({ length: 6 }, (_, i) => `line ${i + 1}\n`).join(''));
    } finally {
      client.close();
      await proxy.close();
    }
  });

  it('reports lost events as a gap event when a resume cannot replay them', async () => {
    // Output fast enough that events are in flight when the connection drops.
    const sb0 = ctx.sandbox('gap');
    const proxy = await startProxy(ctx.url);
    const client = new SbxClient({ url: proxy.url, retry: { retries: 6, minDelayMs: 50, maxDelayMs: 400 } });
    try {
      const sb = getSandbox(client, sb0.id);
      const stream = await sb.execStream('for i in $(seq 1 60); do echo line $i; sleep 0.01; done');
      const events = [];
      let cut = false;
      for await (const ev of stream) {
        events.push(ev);
        if (!cut && ev.type === 'stdout' && ev.data.includes('line 5')) {
          cut = true;
          proxy.cut();
        }
      }
      assert.equal(events.at(-1).type, 'complete');
      // SDK guarantee: strictly increasing seqs, and every hole is announced by a gap event.
      let last = 0;
      for (const ev of events) {
        if (ev.type === 'gap') {
          last += ev.missed;
          continue;
        }
        assert.equal(ev.seq, last + 1, `event ${ev.seq} follows ${last} (or a gap accounts for the hole)`);
        last = ev.seq;
      }
    } finally {
      client.close();
      await proxy.close();
    }
  });

  it(
    'loses no event when a resume follows a drop with events in flight',
    async () => {
      const sb0 = ctx.sandbox('noloss');
      const proxy = await startProxy(ctx.url);
      const client = new SbxClient({ url: proxy.url, retry: { retries: 6, minDelayMs: 50, maxDelayMs: 400 } });
      try {
        const sb = getSandbox(client, sb0.id);
        const stream = await sb.execStream('for i in $(seq 1 60); do echo line $i; sleep 0.01; done');
        const events = [];
        let cut = false;
        for await (const ev of stream) {
          events.push(ev);
          if (!cut && ev.type === 'stdout' && ev.data.includes('line 5')) {
            cut = true;
            proxy.cut();
          }
        }
        assert.equal(events.filter((e) => e.type === 'gap').length, 0, 'no gap');
      } finally {
        client.close();
        await proxy.close();
      }
    },
  );

  it('can be closed and resumed by stream ID from the last event seen', async () => {
    const sb = ctx.sandbox('manual');
    const ac = new AbortController();
    const stream = await sb.execStream('for i in $(seq 1 6); do echo n$i; sleep 0.4; done', { signal: ac.signal });
    const first = [];
    await assert.rejects(
      (async () => {
        for await (const ev of stream) {
          first.push(ev);
          if (ev.type === 'stdout' && ev.data.includes('n2')) ac.abort(new Error('stop reading'));
        }
      })(),
      /stop reading/,
    );
    const rest = await sb.resumeStream(stream.streamId, stream.lastEventId);
    const second = await rest.toArray();
    const all = [...first, ...second];
    assert.deepEqual(all.map((e) => e.seq), all.map((_, i) => i + 1));
    assert.equal(all.filter((e) => e.type === 'stdout').map((e) => e.data).join(''), 'n1\nn2\nn3\nn4\nn5\nn6\n');
    assert.equal(all.at(-1).type, 'complete');
  });

  it('cancels the command when the loop is left early', async () => {
    const sb = ctx.sandbox('cancel');
    const stream = await sb.execStream('echo started; sleep 30; echo never');
    for await (const ev of stream) if (ev.type === 'stdout') break;
    // The command was killed: the session is free again at once.
    const t0 = Date.now();
    const r = await sb.exec('echo next');
    assert.equal(r.stdout, 'next\n');
    assert.ok(Date.now() - t0 < 10_000);
    await assert.rejects(sb.resumeStream('exec-does-not-exist', 0), StreamNotFoundError);
  });
});
