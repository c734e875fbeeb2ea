// Sessions and environment variables.
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';

import { SessionAlreadyExistsError, SessionNotFoundError, ValidationFailedError } from '../dist/index.js';
import { useDaemon } from './helpers.mjs';

const ctx = useDaemon();

describe('sessions', () => {
  it('keep cwd, variables and functions between commands', async () => {
    const sb = ctx.sandbox('sess');
    const s = await sb.createSession({ id: 'work', env: { ROLE: 'builder' }, cwd: '/tmp' });
    assert.equal(s.id, 'work');
    assert.equal(s.sandboxId, sb.id);
    await s.exec('mkdir -p proj && cd proj && COUNT=41 && inc() { echo $((COUNT + 1)); }');
    const r = await s.exec('echo "$(pwd) $ROLE $(inc)"');
    assert.equal(r.stdout, '/tmp/proj builder 42\n');
    assert.equal(r.sessionId, 'work');
    const info = await s.info();
    assert.equal(info.cwd, '/tmp/proj');
    assert.equal(info.shellRunning, true);

    // Relative file paths follow the session's cwd.
    await s.writeFile('note.txt', 'in proj');
    assert.equal((await sb.readFile('/tmp/proj/note.txt')).content, 'in proj');

    // Another session and the default session are separate shells.
    assert.equal((await sb.exec('echo "[$COUNT] $(pwd)"')).stdout, '[] /workspace\n');
    const other = await sb.getSession('other');
    assert.equal((await other.exec('echo "[$COUNT]"')).stdout, '[]\n');

    const ids = (await sb.listSessions()).map((x) => x.id).sort();
    assert.deepEqual(ids, ['default', 'other', 'work']);
  });

  it('refuses a duplicate ID with SessionAlreadyExistsError', async () => {
    const sb = ctx.sandbox('dup');
    await sb.createSession({ id: 'one' });
    await assert.rejects(sb.createSession({ id: 'one' }), (err) => {
      assert.ok(err instanceof SessionAlreadyExistsError);
      assert.equal(err.code, 'SESSION_ALREADY_EXISTS');
      assert.equal(err.httpStatus, 409);
      return true;
    });
    const del = await sb.deleteSession('one');
    assert.equal(del.success, true);
    await assert.rejects(sb.deleteSession('one'), SessionNotFoundError);
    await assert.rejects(sb.deleteSession('default'), ValidationFailedError);
    // The ID is free again.
    const again = await sb.createSession({ id: 'one' });
    assert.equal((await again.exec('echo ok')).stdout, 'ok\n');
  });

  it('sets environment variables for the sandbox and for one session', async () => {
    const sb = ctx.sandbox('envvars');
    await sb.setEnvVars({ APP_MODE: 'test', GONE: 'x' });
    await sb.setEnvVars({ GONE: undefined });
    assert.equal((await sb.exec('echo "$APP_MODE[$GONE]"')).stdout, 'test[]\n');
    // Inherited by sessions created later.
    const s = await sb.createSession({ id: 'later' });
    assert.equal((await s.exec('echo $APP_MODE')).stdout, 'test\n');
    // A session's own variables stay in it.
    await s.setEnvVars({ ONLY_HERE: "it's quoted" });
    assert.equal((await s.exec('echo "$ONLY_HERE"')).stdout, "it's quoted\n");
    assert.equal((await sb.exec('echo "[$ONLY_HERE]"')).stdout, '[]\n');
  });

  it('configures sleepAfter and keepAlive on first use, and reports status', async () => {
    const sb = ctx.sandbox('conf', { sleepAfter: '5m', keepAlive: false });
    await sb.exec('true');
    const st = await sb.status();
    assert.equal(st.id, sb.id);
    assert.equal(st.state, 'running');
    assert.equal(st.sleepAfter, 300_000);
    assert.equal(st.keepAlive, false);
    assert.equal(typeof st.limits.memory, 'number');
    const c = await sb.configure({ keepAlive: true });
    assert.equal(c.keepAlive, true);
  });
});
