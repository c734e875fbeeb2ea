// The README's ported Cloudflare program runs unchanged against sbx.
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';

import { useDaemon } from './helpers.mjs';

const ctx = useDaemon();

describe('ported Cloudflare program (examples/ported.mjs)', () => {
  it('runs', async () => {
    process.env.SBX_URL = ctx.url; // the example uses new SbxClient() with its defaults
    const { demo } = await import('../examples/ported.mjs');
    const log = await demo(ctx.newId('example'));
    assert.deepEqual(log.filter((l) => !l.startsWith('preview:')), [
      'exec: exit 0, stdout "Hello from sbx\\n"',
      'stream: step 1',
      'stream: step 2',
      'stream: step 3',
      'stream: done, exit 0',
      'runCode: 45',
      'session: two /var',
      'error: FILE_NOT_FOUND 404',
    ]);
    assert.match(log.find((l) => l.startsWith('preview:')), /^preview: http:\/\/8000-ts-\d+-\d+-example-<token>\.localhost\/$/);
  });
});
