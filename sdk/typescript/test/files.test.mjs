// Files: write/read (text and binary), streams, list, exists, mkdir,
// rename/move/delete, watch, errors.
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { describe, it } from 'node:test';

import {
  collectFile,
  FileExistsError,
  FileNotFoundError,
  FileSystemError,
  SandboxError,
  streamFile,
  ValidationFailedError,
} from '../dist/index.js';
import { useDaemon } from './helpers.mjs';

const ctx = useDaemon();

describe('files', () => {
  it('writes and reads text and binary files', async () => {
    const sb = ctx.sandbox('files');
    const w = await sb.writeFile('/workspace/dir/hello.txt', 'héllo wörld\n');
    assert.equal(w.success, true);
    assert.equal(w.path, '/workspace/dir/hello.txt');
    assert.equal(w.bytesWritten, Buffer.byteLength('héllo wörld\n'));

    const r = await sb.readFile('/workspace/dir/hello.txt');
    assert.equal(r.content, 'héllo wörld\n');
    assert.equal(r.encoding, 'utf-8');
    assert.equal(r.isBinary, false);
    assert.equal(r.size, Buffer.byteLength('héllo wörld\n'));

    // Relative paths resolve against the session's cwd (/workspace).
    assert.equal((await sb.readFile('dir/hello.txt')).content, 'héllo wörld\n');

    const png = Buffer.concat([Buffer.from('89504e470d0a1a0a', 'hex'), randomBytes(3000), Buffer.from([0, 0xff, 0xfe])]);
    await sb.writeFile('/workspace/img.png', png);
    const rb = await sb.readFile('/workspace/img.png');
    assert.equal(rb.isBinary, true);
    assert.equal(rb.encoding, 'base64');
    assert.equal(rb.mimeType, 'image/png');
    assert.equal(rb.size, png.length);
    assert.deepEqual(Buffer.from(rb.content, 'base64'), png);

    // base64 text content, and forcing an encoding on read.
    await sb.writeFile('/workspace/b64.txt', Buffer.from('from base64').toString('base64'), { encoding: 'base64' });
    assert.equal((await sb.readFile('/workspace/b64.txt')).content, 'from base64');
    const forced = await sb.readFile('/workspace/b64.txt', { encoding: 'base64' });
    assert.equal(forced.encoding, 'base64');
    assert.equal(Buffer.from(forced.content, 'base64').toString(), 'from base64');
    await assert.rejects(sb.writeFile('/workspace/x', '!!!not base64', { encoding: 'base64' }), ValidationFailedError);

    // Commands see the same files.
    assert.equal((await sb.exec('cat /workspace/dir/hello.txt')).stdout, 'héllo wörld\n');
  });

  it('streams files: text as strings, binary as bytes', async () => {
    const sb = ctx.sandbox('fstream');
    const text = 'line\n'.repeat(30000); // 150 000 bytes: several chunks
    await sb.writeFile('/workspace/big.txt', text);
    const events = await (await sb.readFileStream('/workspace/big.txt')).toArray();
    assert.equal(events[0].type, 'metadata');
    assert.equal(events[0].isBinary, false);
    assert.ok(events.filter((e) => e.type === 'chunk').length >= 2);
    assert.equal(events.at(-1).type, 'complete');
    assert.equal(events.at(-1).bytesRead, text.length);
    const got = await collectFile(await sb.readFileStream('/workspace/big.txt'));
    assert.equal(got.content, text);
    assert.equal(got.metadata.size, text.length);

    const bin = randomBytes(200_000);
    bin[0] = 0; // surely binary
    await sb.writeFile('/workspace/blob.bin', bin);
    const chunks = [];
    for await (const c of streamFile(await sb.readFileStream('/workspace/blob.bin'))) chunks.push(c);
    assert.ok(chunks.every((c) => c instanceof Uint8Array));
    assert.deepEqual(Buffer.concat(chunks), bin);
    const all = await collectFile(await sb.readFileStream('blob.bin'));
    assert.equal(all.metadata.isBinary, true);
    assert.deepEqual(Buffer.from(all.content), bin);

    await assert.rejects(sb.readFileStream('/workspace/nope.bin'), FileNotFoundError);
  });

  it('lists, checks, creates, renames, moves and deletes', async () => {
    const sb = ctx.sandbox('fsops');
    await sb.mkdir('/workspace/a/b/c', { recursive: true });
    await assert.rejects(sb.mkdir('/workspace/a/b/c'), FileExistsError);
    await sb.writeFile('/workspace/a/one.txt', '1');
    await sb.writeFile('/workspace/a/b/two.txt', '22');
    await sb.writeFile('/workspace/a/.hidden', 'h');

    const top = await sb.listFiles('/workspace/a');
    assert.deepEqual(top.files.map((f) => f.name).sort(), ['b', 'one.txt']);
    const one = top.files.find((f) => f.name === 'one.txt');
    assert.equal(one.type, 'file');
    assert.equal(one.size, 1);
    assert.equal(one.absolutePath, '/workspace/a/one.txt');
    assert.equal(one.permissions.readable, true);
    assert.equal(top.files.find((f) => f.name === 'b').type, 'directory');

    const deep = await sb.listFiles('/workspace/a', { recursive: true, includeHidden: true });
    assert.deepEqual(deep.files.map((f) => f.relativePath).sort(), ['.hidden', 'b', 'b/c', 'b/two.txt', 'one.txt']);
    assert.equal(deep.count, 5);

    assert.equal((await sb.exists('/workspace/a/one.txt')).exists, true);
    assert.equal((await sb.exists('/workspace/a/zzz')).exists, false);

    await sb.renameFile('/workspace/a/one.txt', '/workspace/a/uno.txt');
    assert.equal((await sb.exists('/workspace/a/one.txt')).exists, false);
    await sb.moveFile('/workspace/a/uno.txt', '/workspace/a/b/c');
    assert.equal((await sb.readFile('/workspace/a/b/c/uno.txt')).content, '1');

    await sb.deleteFile('/workspace/a/b/c/uno.txt');
    assert.equal((await sb.exists('/workspace/a/b/c/uno.txt')).exists, false);
    await assert.rejects(sb.deleteFile('/workspace/a/b'), (err) => {
      assert.ok(err instanceof FileSystemError);
      assert.equal(err.code, 'IS_DIRECTORY');
      assert.equal(err.httpStatus, 400);
      return true;
    });
  });

  it('maps missing files to FileNotFoundError', async () => {
    const sb = ctx.sandbox('fserr');
    const calls = [
      () => sb.readFile('/workspace/missing.txt'),
      () => sb.deleteFile('/workspace/missing.txt'),
      () => sb.listFiles('/workspace/missing-dir'),
      () => sb.renameFile('/workspace/missing', '/workspace/x'),
    ];
    for (const call of calls) {
      await assert.rejects(call(), (err) => {
        assert.ok(err instanceof FileNotFoundError, `${err.name}: ${err.message}`);
        assert.ok(err instanceof SandboxError);
        assert.equal(err.code, 'FILE_NOT_FOUND');
        assert.equal(err.httpStatus, 404);
        assert.equal(typeof err.context.path, 'string');
        return true;
      });
    }
  });

  it('watches a directory for changes', async () => {
    const sb = ctx.sandbox('watch');
    await sb.mkdir('/workspace/w', { recursive: true });
    const watch = await sb.watch('/workspace/w');
    const seen = [];
    const reader = (async () => {
      for await (const ev of watch) {
        seen.push(ev);
        if (ev.type === 'event' && ev.eventType === 'delete') break; // leaves the loop: stops the watch
      }
    })();
    await sb.writeFile('/workspace/w/new.txt', 'x');
    await sb.deleteFile('/workspace/w/new.txt');
    await reader;
    assert.equal(seen[0].type, 'watching');
    const kinds = seen.filter((e) => e.type === 'event').map((e) => `${e.eventType}:${e.path}`);
    assert.ok(kinds.includes('create:/workspace/w/new.txt'), kinds.join(','));
    assert.ok(kinds.includes('delete:/workspace/w/new.txt'), kinds.join(','));
  });
});
