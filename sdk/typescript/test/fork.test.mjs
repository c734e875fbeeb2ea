// Fork (docs/persistence.md, "Fork"): sandbox.fork(ids) of a persistent
// sandbox gives new sandboxes holding its files, independent afterwards;
// a fork into an existing sandbox rejects with SandboxExistsError. The
// test daemon runs two shards: an ID owned by the other shard rejects with
// ForkCrossShardError, and the test then takes the next ID.
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';

import { ForkCrossShardError, SandboxExistsError, getSandbox } from '../dist/index.js';
import { useDaemon } from './helpers.mjs';

const ctx = useDaemon();

describe('fork', () => {
  it('copies the workspace into new, independent sandboxes', async () => {
    const src = ctx.sandbox('fks');
    await src.call('create', { workspace: 'persistent' });
    await src.exec("mkdir -p /workspace/p && echo hello > /workspace/p/a && head -c 100000 /dev/urandom > /workspace/p/b");
    const sums = 'sha256sum /workspace/p/a /workspace/p/b';
    const want = (await src.exec(sums)).stdout;

    let forkId;
    for (let i = 0; i < 40 && !forkId; i++) {
      const id = ctx.newId('fkf');
      try {
        const r = await src.fork([id]);
        assert.deepEqual(r.ids, [id]);
        forkId = id;
      } catch (e) {
        if (!(e instanceof ForkCrossShardError)) throw e;
      }
    }
    assert.ok(forkId, 'no ID of the source\'s shard in 40 tries');
    const fork = getSandbox(ctx.client, forkId);
    assert.equal((await fork.exec(sums)).stdout, want);

    await fork.exec('echo mine > /workspace/p/only-fork');
    const seen = await src.exec('ls /workspace/p');
    assert.equal(seen.stdout, 'a\nb\n');

    await assert.rejects(src.fork([forkId]), SandboxExistsError);
  });
});
