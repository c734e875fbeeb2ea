// Preview URLs: expose a port, fetch through the gateway, unexpose.
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';

import { InvalidPortError, PortAlreadyExposedError, SandboxError } from '../dist/index.js';
import { fetchVia, sleep, useDaemon } from './helpers.mjs';

const ctx = useDaemon();

describe('ports', () => {
  it('exposes a port at a preview URL that proxies to the sandbox', async () => {
    const sb = ctx.sandbox('web');
    await sb.writeFile('/workspace/site/index.html', '<h1>hello from the sandbox</h1>\n');
    const server = await sb.startProcess('python3 -m http.server 8080', { cwd: '/workspace/site', processId: 'site' });
    await server.waitForPort(8080, { timeout: 20_000 });

    const exposed = await sb.exposePort(8080, { name: 'site' });
    assert.equal(exposed.port, 8080);
    assert.equal(exposed.name, 'site');
    assert.match(exposed.url, new RegExp(`^http://8080-${sb.id}-[a-z0-9_]{16}\\.`));
    assert.equal(exposed.token.length, 16);

    const res = await fetchVia(ctx.url, exposed.url);
    assert.equal(res.status, 200);
    assert.equal(res.body, '<h1>hello from the sandbox</h1>\n');
    const missing = await fetchVia(ctx.url, exposed.url + 'nope.txt');
    assert.equal(missing.status, 404);

    // Re-exposing keeps the token; the list shows the URL.
    const again = await sb.exposePort(8080);
    assert.equal(again.url, exposed.url);
    const ports = await sb.getExposedPorts();
    assert.deepEqual(ports.map((p) => [p.port, p.url, p.status]), [[8080, exposed.url, 'active']]);

    // A wrong token is refused.
    const wrong = exposed.url.replace(exposed.token, 'x'.repeat(16));
    assert.equal((await fetchVia(ctx.url, wrong)).status, 404);

    await sb.unexposePort(8080);
    assert.deepEqual(await sb.getExposedPorts(), []);
    let status = 0;
    for (let i = 0; i < 20 && status !== 404; i++) {
      status = (await fetchVia(ctx.url, exposed.url)).status;
      if (status !== 404) await sleep(100);
    }
    assert.equal(status, 404);
  });

  it('validates ports and tokens', async () => {
    const sb = ctx.sandbox('badport');
    await assert.rejects(sb.exposePort(80), (err) => {
      assert.ok(err instanceof InvalidPortError);
      assert.ok(err instanceof SandboxError);
      assert.equal(err.code, 'INVALID_PORT_NUMBER');
      assert.equal(err.httpStatus, 400);
      return true;
    });
    await sb.exposePort(9001, { token: 'mytoken_1' });
    await assert.rejects(sb.exposePort(9002, { token: 'mytoken_1' }), PortAlreadyExposedError);
  });
});
