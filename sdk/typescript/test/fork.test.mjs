// Fork (docs/persistence.md, "Fork"): sandbox.fork(ids) of a persistent
// sandbox gives new sandboxes holding its files, independent afterwards;
// a fork into an existing sandbox rejects with SandboxExistsError. The
// test daemon runs two shards: of four forks, some land on the source's
// shard and some on the other (staged and adopted), all with the files.
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';

import { SandboxExistsError, getSandbox } from '../dist/index.js';
import { useDaemon } from './helpers.mjs';

const ctx = useDaemon();

describe('fork', () => {
  it('copies the workspace into new, independent sandboxes', async () => {
    const src = ctx.sandbox('fks');
    await src.call('create', { workspace: 'persistent' });
    await src.exec("mkdir -p /workspace/p && echo hello > /workspace/p/a && head -c 100000 /dev/urandom > /workspace/p/b");
    const sums = 'sha256sum /workspace/p/a /workspace/p/b';
    const want = (await src.exec(sums)).stdout;

    const ids = [ctx.newId('fk1'), ctx.newId('fk2'), ctx.newId('fk3'), ctx.newId('fk4')];
    const r = await src.fork(ids);
    assert.deepEqual(r.ids, ids);
    for (const id of ids) {
      assert.equal((await getSandbox(ctx.client, id).exec(sums)).stdout, want, `fork ${id}`);
    }
    const forkId = ids[0];
    const fork = getSandbox(ctx.client, forkId);

    await fork.exec('echo mine > /workspace/p/only-fork');
    const seen = await src.exec('ls /workspace/p');
    assert.equal(seen.stdout, 'a\nb\n');

    await assert.rejects(src.fork([forkId]), SandboxExistsError);
  });
});
