// Images (docs/images.md): an OCI layout built here (a minimal ustar writer,
// node:zlib, node:crypto: the host's bash and its libraries plus
// busybox-static, two layers, a whiteout in the second), imported with
// client.importImage (a path of this machine, which is the server's), a
// sandbox from it with getSandbox(client, id, {image}), list / inspect /
// remove, and the errors of an unknown and a tampered image; a template
// (client.buildTemplate) and a failing build step; startImage.
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { chmodSync, existsSync, mkdirSync, mkdtempSync, readFileSync, realpathSync, rmSync, writeFileSync, readdirSync, statSync } from 'node:fs';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';
import { gzipSync } from 'node:zlib';

import { ImageInvalidError, ImageNotFoundError, TemplateBuildFailedError, getSandbox } from '../dist/index.js';
import { useDaemon } from './helpers.mjs';

const ctx = useDaemon();
const LIBS = ['/lib/x86_64-linux-gnu/libtinfo.so.6', '/lib/x86_64-linux-gnu/libc.so.6', '/lib64/ld-linux-x86-64.so.2'];
const usable = existsSync('/bin/busybox') && LIBS.every((p) => existsSync(p));

/** One ustar header + data (POSIX ustar: 512-byte blocks, octal fields). */
function tarEntry(name, type, data = Buffer.alloc(0), link = '') {
  const h = Buffer.alloc(512);
  const put = (s, off, len) => h.write(s, off, len, 'utf8');
  const oct = (n, off, len) => put(n.toString(8).padStart(len - 1, '0') + '\0', off, len);
  put(name, 0, 100);
  oct(type === '5' ? 0o755 : 0o755, 100, 8);
  oct(0, 108, 8);
  oct(0, 116, 8);
  oct(type === '0' ? data.length : 0, 124, 12);
  oct(1700000000, 136, 12);
  h.fill(' ', 148, 156);
  put(type, 156, 1);
  put(link, 157, 100);
  put('ustar\0', 257, 6);
  put('00', 263, 2);
  let sum = 0;
  for (const b of h) sum += b;
  put(sum.toString(8).padStart(6, '0') + '\0 ', 148, 8);
  const pad = type === '0' ? Buffer.alloc((512 - (data.length % 512)) % 512) : Buffer.alloc(0);
  return Buffer.concat([h, type === '0' ? data : Buffer.alloc(0), pad]);
}

function tar(entries) {
  return Buffer.concat([...entries.map((e) => tarEntry(...e)), Buffer.alloc(1024)]);
}

function layout(dir, layers, env, extra = {}) {
  mkdirSync(path.join(dir, 'blobs', 'sha256'), { recursive: true });
  writeFileSync(path.join(dir, 'oci-layout'), '{"imageLayoutVersion":"1.0.0"}');
  const blob = (data) => {
    const d = createHash('sha256').update(data).digest('hex');
    writeFileSync(path.join(dir, 'blobs', 'sha256', d), data);
    return { digest: `sha256:${d}`, size: data.length };
  };
  const diffs = layers.map((t) => `sha256:${createHash('sha256').update(t).digest('hex')}`);
  const descs = layers.map((t) => ({ mediaType: 'application/vnd.oci.image.layer.v1.tar+gzip', ...blob(gzipSync(t)) }));
  const cfg = blob(Buffer.from(JSON.stringify({ architecture: 'amd64', os: 'linux', config: { Env: env, ...extra }, rootfs: { type: 'layers', diff_ids: diffs } })));
  const man = blob(Buffer.from(JSON.stringify({
    schemaVersion: 2,
    mediaType: 'application/vnd.oci.image.manifest.v1+json',
    config: { mediaType: 'application/vnd.oci.image.config.v1+json', ...cfg },
    layers: descs,
  })));
  writeFileSync(path.join(dir, 'index.json'), JSON.stringify({ schemaVersion: 2, manifests: [{ mediaType: 'application/vnd.oci.image.manifest.v1+json', ...man }] }));
  return man.digest;
}

describe('images', { skip: !usable && 'needs busybox-static and the host bash libraries' }, () => {
  let work;
  let digest;
  const build = (extra) => {
    const file = (p) => readFileSync(realpathSync(p));
    const base = [
      ['bin', '5'], ['lib', '5'], ['lib/x86_64-linux-gnu', '5'], ['lib64', '5'], ['etc', '5'], ['usr', '5'],
      ['bin/busybox', '0', file('/bin/busybox')], ['bin/bash', '0', file('/bin/bash')],
      ['etc/os-release', '0', Buffer.from('ID=base\n')], ['gone', '0', Buffer.from('x\n')],
      ...['sh', 'cat', 'ls', 'echo', 'true'].map((a) => [`bin/${a}`, '2', undefined, 'busybox']),
      ...LIBS.map((p) => [p.slice(1), '0', file(p)]),
    ];
    const top = [['etc', '5'], ['etc/os-release', '0', Buffer.from('ID=tsimage\n')], ['.wh.gone', '0', Buffer.alloc(0)]];
    rmSync(path.join(work, 'img'), { recursive: true, force: true });
    digest = layout(path.join(work, 'img'), [tar(base), tar(top)], ['PATH=/usr/bin:/bin', 'TSIMG=1'], extra);
  };
  before(() => {
    work = mkdtempSync('/tmp/sbx-tsimg-');
    chmodSync(work, 0o755);
  });
  after(() => rmSync(work, { recursive: true, force: true }));

  it('imports a layout and runs a sandbox of it', async () => {
    build();
    const name = `tstest/${process.pid}:1`;
    const r = await ctx.client.importImage(path.join(work, 'img'), name);
    assert.equal(r.digest, digest);
    const list = await ctx.client.listImages();
    assert.ok(list.images.some((i) => i.names.includes(name)));
    const info = await ctx.client.inspectImage(name);
    assert.deepEqual(info.image.config.env, ['PATH=/usr/bin:/bin', 'TSIMG=1']);

    const sb = getSandbox(ctx.client, ctx.newId('img'), { image: name });
    const out = await sb.exec('cat /etc/os-release; echo $TSIMG; ls /gone 2>/dev/null || echo gone');
    assert.equal(out.stdout, 'ID=tsimage\n1\ngone\n');
    await sb.destroy();
    assert.equal((await ctx.client.removeImage(name)).removed, 1);
    await assert.rejects(ctx.client.inspectImage(name), ImageNotFoundError);
  });

  it('builds a template whose sandboxes see its steps, and reports a failing step', async () => {
    build();
    const base = `tstest/${process.pid}:tplbase`;
    const tpl = `tstest/${process.pid}:tpl`;
    await ctx.client.importImage(path.join(work, 'img'), base);
    const r = await ctx.client.buildTemplate(tpl, base, ['echo baked > /etc/baked', 'rm /etc/os-release']);
    assert.notEqual(r.digest, digest);
    assert.equal(r.image.layers, 3);
    const sb = getSandbox(ctx.client, ctx.newId('tpl'), { image: tpl });
    const out = await sb.exec('cat /etc/baked; cat /etc/os-release 2>/dev/null || echo removed');
    assert.equal(out.stdout, 'baked\nremoved\n');
    await sb.destroy();
    await assert.rejects(ctx.client.buildTemplate(`${tpl}-bad`, base, ['echo why >&2; exit 4']),
      (e) => e instanceof TemplateBuildFailedError && /exited with 4/.test(e.message) && /why/.test(e.message));
    await assert.rejects(ctx.client.inspectImage(`${tpl}-bad`), ImageNotFoundError);
    assert.equal((await ctx.client.removeImage(tpl)).removed, 1);
    assert.equal((await ctx.client.removeImage(base)).removed, 1);
  });

  it('starts the image\'s Entrypoint + Cmd with startImage', async () => {
    build({ Entrypoint: ['/bin/sh', '-c'], Cmd: ['echo up > /tmp/up; exec cat'], ExposedPorts: { '3000/tcp': {} } });
    const name = `tstest/${process.pid}:start`;
    await ctx.client.importImage(path.join(work, 'img'), name);
    const sb = getSandbox(ctx.client, ctx.newId('start'), { image: name, startImage: true });
    let out = '';
    for (let i = 0; i < 100 && out !== 'up\n'; i++) {
      out = (await sb.exec('cat /tmp/up 2>/dev/null || true')).stdout;
      if (out !== 'up\n') await new Promise((r) => setTimeout(r, 50));
    }
    assert.equal(out, 'up\n');
    await sb.destroy();
    assert.equal((await ctx.client.removeImage(name)).removed, 1);
  });

  it('refuses an unknown image and a tampered layer', async () => {
    const sb = getSandbox(ctx.client, ctx.newId('none'), { image: 'no/such:image' });
    await assert.rejects(sb.exec('true'), ImageNotFoundError);
    build();
    const blobs = path.join(work, 'img', 'blobs', 'sha256');
    const big = readdirSync(blobs).sort((a, b) => statSync(path.join(blobs, b)).size - statSync(path.join(blobs, a)).size)[0];
    const data = readFileSync(path.join(blobs, big));
    data[1000] ^= 0xff;
    writeFileSync(path.join(blobs, big), data);
    await assert.rejects(ctx.client.importImage(path.join(work, 'img'), `tstest/${process.pid}:bad`), ImageInvalidError);
  });
});
