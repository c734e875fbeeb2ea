// Backups (docs/persistence.md, "Backups"): sandbox.createBackup in one
// sandbox, restoreBackup into another (into the backup's dir, and into a dir
// named at restore) with identical content there; client.listBackups shows
// it; client.deleteBackup removes it, after which a restore rejects with
// BackupNotFoundError; a dir outside the sandbox's paths is
// ValidationFailedError.  With `gitignore: true` what the tree's .gitignore
// names is left out (a non-boolean is ValidationFailedError).
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';

import { BackupNotFoundError, ValidationFailedError } from '../dist/index.js';
import { useDaemon } from './helpers.mjs';

const ctx = useDaemon();
const TREE = "mkdir -p /workspace/bk/src && cd /workspace/bk && echo 'print(1)' > src/main.py && " +
  'head -c 200000 /dev/urandom > data.bin && ln -s src/main.py link';
const sums = (dir) => `cd ${dir} && find . -printf '%y %p %l\\n' | sort && find . -type f | sort | xargs sha256sum`;

describe('backups', () => {
  it('backs up in one sandbox and restores into another, identical; lists and deletes', async () => {
    const a = ctx.sandbox('bka');
    const b = ctx.sandbox('bkb');
    await a.exec(TREE);
    const want = (await a.exec(sums('/workspace/bk'))).stdout;
    assert.match(want, /l \.\/link src\/main\.py/);
    const bk = await a.createBackup({ dir: '/workspace/bk', name: 'ts', ttl: 600 });
    assert.equal(bk.dir, '/workspace/bk');
    assert.match(bk.digest, /^sha256:[0-9a-f]{64}$/);
    assert.ok(bk.size > 0);

    await b.exec('mkdir -p /workspace/bk && echo stale > /workspace/bk/stale');
    assert.equal((await b.restoreBackup(bk)).success, true);
    assert.equal((await b.exec(sums('/workspace/bk'))).stdout, want);
    await b.restoreBackup(bk, { dir: '/tmp/elsewhere' });
    assert.equal((await b.exec(sums('/tmp/elsewhere'))).stdout, want);

    const listed = (await ctx.client.listBackups()).backups.filter((x) => x.id === bk.id);
    assert.equal(listed.length, 1);
    assert.equal(listed[0].name, 'ts');
    assert.equal(listed[0].digest, bk.digest);

    await a.exec("printf '*.bin\\n' > /workspace/bk/.gitignore");
    const gi = await a.createBackup({ dir: '/workspace/bk', gitignore: true });
    await b.restoreBackup(gi, { dir: '/tmp/gi' });
    assert.equal((await b.exec('cd /tmp/gi && ls -A')).stdout, '.gitignore\nlink\nsrc\n');
    await assert.rejects(a.createBackup({ dir: '/workspace/bk', gitignore: 'yes' }), ValidationFailedError);
    await ctx.client.deleteBackup(gi.id);

    await ctx.client.deleteBackup(bk.id);
    await assert.rejects(b.restoreBackup(bk), BackupNotFoundError);
    await assert.rejects(ctx.client.deleteBackup(bk.id), BackupNotFoundError);
    await assert.rejects(a.createBackup({ dir: '../..' }), ValidationFailedError);
  });
});
