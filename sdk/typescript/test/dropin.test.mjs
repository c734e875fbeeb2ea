// Issue 19: Cloudflare SDK behaviours a ported program relies on, one test
// per item (docs/protocol.md §7 lists what still differs, and
// differences.test.mjs keeps that list honest).
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';

import {
  CustomDomainRequiredError,
  SandboxError,
  SandboxNotFoundError,
  SessionTerminatedError,
  ValidationFailedError,
} from '../dist/index.js';
import { sleep, useDaemon } from './helpers.mjs';

const ctx = useDaemon();

/** The SDK's version token: watch-<n>-<n>:<n>. */
const VERSION = /^watch-\d+-\d+:\d+$/;

describe('drop-in behaviours (issue 19)', () => {
  it('exit N in a session: SESSION_TERMINATED with the SDK phrase', async () => {
    const sb = ctx.sandbox('dying');
    const s = await sb.createSession({ id: 'dying' });
    await assert.rejects(s.exec('exit 42'), (err) => {
      assert.ok(err instanceof SessionTerminatedError);
      assert.equal(err.code, 'SESSION_TERMINATED');
      assert.equal(err.httpStatus, 410);
      // What programs written for the Cloudflare SDK match on.
      assert.match(err.message, /shell exited/);
      assert.match(err.message, /exit code:? 42/);
      return true;
    });
    assert.equal((await s.exec('echo fresh')).stdout, 'fresh\n');
  });

  it('createSession with a cwd that does not exist starts in $HOME', async () => {
    const sb = ctx.sandbox('nocwd');
    const s = await sb.createSession({ id: 'lost', cwd: '/nonexistent' });
    assert.equal(s.id, 'lost');
    const r = await s.exec('test "$(pwd -P)" = "$(cd ~ && pwd -P)" && echo home; test -e /nonexistent || echo absent');
    assert.equal(r.stdout, 'home\nabsent\n');
  });

  it('checkChanges: unchanged, changed, resync and malformed since', async () => {
    const sb = ctx.sandbox('changes');
    await sb.mkdir('/workspace/proj', { recursive: true });
    const first = await sb.checkChanges('/workspace/proj');
    assert.equal(first.success, true);
    assert.equal(first.status, 'unchanged');
    assert.match(first.version, VERSION);
    assert.equal(typeof first.timestamp, 'string');

    const same = await sb.checkChanges('/workspace/proj', { since: first.version });
    assert.equal(same.status, 'unchanged');
    assert.equal(same.version, first.version);

    await sb.writeFile('/workspace/proj/a.txt', 'x');
    const changed = await sb.checkChanges('/workspace/proj', { since: first.version });
    assert.equal(changed.status, 'changed');
    assert.notEqual(changed.version, first.version);
    assert.equal((await sb.checkChanges('/workspace/proj', { since: changed.version })).status, 'unchanged');

    for (const since of ['bogus', 'watch-1-1:', 'watch-1-1:-1']) {
      await assert.rejects(sb.checkChanges('/workspace/proj', { since }), ValidationFailedError, since);
    }
    const ahead = changed.version.replace(/:\d+$/, ':99999');
    await assert.rejects(sb.checkChanges('/workspace/proj', { since: ahead }), ValidationFailedError);

    // The directory went away and came back: this container dropped the state.
    await sb.exec('rm -r /workspace/proj && mkdir /workspace/proj');
    const expired = await sb.checkChanges('/workspace/proj', { since: changed.version });
    assert.equal(expired.status, 'resync');
    assert.equal(expired.reason, 'expired');
    assert.match(expired.version, VERSION);

    // Another container: restarted.
    await sb.destroy();
    await sb.mkdir('/workspace/proj', { recursive: true });
    const restarted = await sb.checkChanges('/workspace/proj', { since: expired.version });
    assert.equal(restarted.status, 'resync');
    assert.equal(restarted.reason, 'restarted');
  });

  it('isPortExposed answers from the sandbox state without creating or waking it', async () => {
    const sb = ctx.sandbox('isexp');
    assert.equal(await sb.isPortExposed(8080), false);
    // It did not create the sandbox.
    await assert.rejects(sb.status(), SandboxNotFoundError);
    await sb.exposePort(8080);
    assert.equal(await sb.isPortExposed(8080), true);
    assert.equal(await sb.isPortExposed(8081), false);
    await sb.unexposePort(8080);
    assert.equal(await sb.isPortExposed(8080), false);
  });

  it('exposePort(3000) works: sbx has no control plane on 3000 (§7)', async () => {
    const sb = ctx.sandbox('p3000');
    const p = await sb.exposePort(3000);
    assert.equal(p.port, 3000);
    assert.match(p.url, new RegExp(`^http://3000-${sb.id}-[a-z0-9_]{16}\\.`));
    assert.equal(await sb.isPortExposed(3000), true);
  });

  it('exposePort with a workers.dev hostname throws CustomDomainRequiredError', async () => {
    const sb = ctx.sandbox('wdev');
    for (const hostname of ['x.workers.dev', 'my-app.ACME.workers.dev']) {
      await assert.rejects(sb.exposePort(8080, { hostname }), (err) => {
        assert.ok(err instanceof CustomDomainRequiredError, `${hostname}: ${err}`);
        assert.ok(err instanceof SandboxError);
        assert.equal(err.code, 'CUSTOM_DOMAIN_REQUIRED');
        assert.equal(err.httpStatus, 400);
        return true;
      });
    }
    assert.equal(await sb.isPortExposed(8080), false);
    // A custom domain is fine.
    const p = await sb.exposePort(8080, { hostname: 'preview.example.com' });
    assert.match(p.url, /\.preview\.example\.com\/$/);
  });

  it('polling status and lists does not keep a sandbox awake', async () => {
    const sb = ctx.sandbox('observe', { sleepAfter: '3s' });
    await sb.exec('true');
    await sb.exposePort(8080);
    const gen = (await sb.status()).generation;
    const t0 = Date.now();
    let st = await sb.status();
    // Bound: sleepAfter 3 s + the shard's once-a-second check + much slack.
    while (st.state === 'running' && Date.now() - t0 < 25_000) {
      await Promise.all([sb.getExposedPorts(), sb.isPortExposed(8080), sb.listProcesses(), sb.listSessions()]);
      await sleep(500);
      st = await sb.status();
    }
    assert.ok(st.state === 'stopped' || st.state === 'stopping', `still ${st.state} after ${Date.now() - t0} ms of polling`);
    // Stopped: the lists are empty and observing does not start it again.
    await sleep(1500);
    assert.deepEqual(await sb.listProcesses(), []);
    assert.deepEqual(await sb.listSessions(), []);
    assert.deepEqual(await sb.getExposedPorts(), []);
    assert.equal(await sb.isPortExposed(8080), false);
    const after = await sb.status();
    assert.ok(after.state === 'stopped' || after.state === 'stopping', `observing woke it: ${after.state}`);
    assert.equal(after.generation, gen);
  });
});
