// The web console (docs/console.md) in a real browser: Debian's chromium driven
// by puppeteer-core, against private `sbxd dev --console` daemons this file
// starts and stops itself (tests/console/run-tests.sh).  Each page loads (a
// screenshot saved under the test's temp dir, its size checked), create and
// destroy from the list, a command typed into the terminal shows its output,
// a file uploaded appears in `sbx ls` (the real CLI), a process's logs arrive
// live, a code cell shows a PNG and HTML in a sandboxed iframe, preview links;
// with keys on, the console without a key sees nothing; without --console,
// /console/ is a 404.  Prints the console's first paint from a cold browser.
import { spawn, spawnSync } from 'node:child_process';
import assert from 'node:assert/strict';
import { closeSync, existsSync, mkdtempSync, openSync, readFileSync, rmSync, statSync,
         writeFileSync } from 'node:fs';
import path from 'node:path';
import { after, before, test } from 'node:test';

import puppeteer from 'puppeteer-core';

const bin = path.resolve(process.env.SBX_BIN);
const chromium = ['/usr/bin/chromium', '/usr/bin/chromium-browser'].find((p) => existsSync(p));
const mark = /^[a-z0-9]{1,8}$/.test(process.env.SBX_TEST_PREFIX ?? '') ? process.env.SBX_TEST_PREFIX : '';
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const tmp = mkdtempSync(`/tmp/sbx-console-${mark}`);
const daemons = [];
const browsers = [];
const sb = (what) => `con-${mark}${process.pid}-${what}`;

/** Start a private sbxd dev with these extra flags; {gateway, http, stop()} once ready.
 *  `key`: the deployment's API key, which the readiness check over nng must
 *  send too (SBX_API_KEY: with keys, nng requests carry one, docs/security.md §6). */
async function startDaemon(tag, extra, key) {
  const data = path.join(tmp, tag);
  const gateway = `ipc://${data}/gw.sock`;
  const name = 'con' + tag + mark + Math.random().toString(36).slice(2, 8).replace(/[^a-z]/g, 'x');
  spawnSync('mkdir', ['-p', data]);
  const fd = openSync(path.join(data, 'sbxd.log'), 'a');
  const child = spawn(path.join(bin, 'sbxd'),
    ['dev', '--data', data, '--listen', gateway, '--name', name, '--shards', '1',
     '--http', '127.0.0.1:0', '--pool', '0', ...extra], { stdio: ['ignore', fd, fd] });
  closeSync(fd);
  const d = { child, gateway, data, http: null };
  daemons.push(d);
  const ready = () => {
    const env = key ? { ...process.env, SBX_API_KEY: key } : process.env;
    const st = spawnSync(path.join(bin, 'sbx'), ['--gateway', gateway, '--json', 'cluster', 'status'], { env });
    try {
      const shards = JSON.parse(st.stdout.toString()).shards;
      return st.status === 0 && shards.length > 0 && shards.every((s) => s.health === 'ok');
    } catch {
      return false;
    }
  };
  for (let i = 0; ; i++) {
    if (ready() && existsSync(path.join(data, 'http.addr'))) break;
    if (i > 300 || child.exitCode !== null) {
      throw new Error('sbxd did not come up:\n' + readFileSync(path.join(data, 'sbxd.log'), 'utf8').slice(-2000));
    }
    await sleep(100);
  }
  d.http = 'http://' + readFileSync(path.join(data, 'http.addr'), 'utf8').trim();
  return d;
}

async function stopDaemon(d) {
  if (d.child.exitCode !== null || d.child.signalCode !== null) return;
  const gone = new Promise((r) => d.child.once('exit', r));
  d.child.kill('SIGTERM');
  const t = setTimeout(() => d.child.kill('SIGKILL'), 20000);
  await gone;
  clearTimeout(t);
  // Under the sanitizer build, the daemon's log must hold no report.
  const log = readFileSync(path.join(d.data, 'sbxd.log'), 'utf8');
  assert.doesNotMatch(log, /ERROR: AddressSanitizer|ERROR: LeakSanitizer|runtime error:/, log.slice(-3000));
}

/** The real CLI against daemon d: its parsed --json output (asserting success). */
function cli(d, ...args) {
  const r = spawnSync(path.join(bin, 'sbx'), ['--gateway', d.gateway, '--json', ...args]);
  assert.equal(r.status, 0, `sbx ${args.join(' ')}: ${r.stderr}`);
  return JSON.parse(r.stdout.toString());
}

async function launch() {
  const b = await puppeteer.launch({
    executablePath: chromium,
    headless: true,
    userDataDir: mkdtempSync(path.join(tmp, 'profile-')),
    args: ['--no-sandbox', '--disable-gpu', '--no-first-run', '--disable-dev-shm-usage'],
  });
  browsers.push(b);
  return b;
}

/** A new page of browser b, failing the test on any error the console's scripts throw. */
async function newPage(b) {
  const page = await b.newPage();
  await page.setViewport({ width: 1200, height: 800 });
  page.errors = [];
  page.on('pageerror', (e) => page.errors.push(String(e)));
  page.on('dialog', (dlg) => dlg.accept());
  return page;
}

/** Save a screenshot of the page under the test's temp dir and check it is not trivial. */
async function shot(page, name) {
  const file = path.join(tmp, `${name}.png`);
  await page.screenshot({ path: file });
  const size = statSync(file).size;
  // A blank 1200x800 page compresses to a few KiB; a page with content is far larger.
  assert.ok(size > 12000, `${name}.png is only ${size} bytes: the page looks empty`);
  assert.deepEqual(page.errors, [], 'the console threw');
  return size;
}

const text = (page, sel) => page.$eval(sel, (e) => e.textContent);

let dev, browser;

before(async () => {
  assert.ok(chromium, 'chromium is not installed: run tools/deps.sh (Debian package chromium)');
  dev = await startDaemon('dev', ['--console']);
});

after(async () => {
  for (const b of browsers) await b.close().catch(() => {});
  for (const d of daemons) await stopDaemon(d);
  // SBX_CONSOLE_KEEP=1 keeps the screenshots and daemon logs to look at.
  if (process.env.SBX_CONSOLE_KEEP === '1') console.log(`# kept ${tmp}`);
  else rmSync(tmp, { recursive: true, force: true });
});

test('first paint from a cold browser (figure)', async () => {
  const t0 = performance.now();
  browser = await launch();
  const page = await newPage(browser);
  const t1 = performance.now();
  await page.goto(`${dev.http}/console/`, { waitUntil: 'load' });
  await page.waitForSelector('#sandboxes');
  const paint = await page.evaluate(() => Object.fromEntries(
    performance.getEntriesByType('paint').map((e) => [e.name, e.startTime])));
  const fp = paint['first-paint'], fcp = paint['first-contentful-paint'];
  assert.ok(fp > 0 && fcp > 0, 'the browser reports the paint: ' + JSON.stringify(paint));
  console.log(`# figure: console first paint ${fp.toFixed(1)} ms, first contentful paint ${fcp.toFixed(1)} ms ` +
              `after navigation start (cold browser and cache; browser start ${(t1 - t0).toFixed(0)} ms; ` +
              `floor 500 ms; noisy on a shared machine)`);
});

test('sandboxes: list with state, create and destroy from the page', async () => {
  const id = sb('list');
  const page = await newPage(browser);
  await page.goto(`${dev.http}/console/`);
  await page.waitForSelector('#list-status');
  await page.type('#new-id', id);
  await page.click('#create');
  await page.waitForSelector(`tr[data-id="${id}"] td.state`, { timeout: 60000 });
  assert.ok(cli(dev, 'list').sandboxes.some((s) => s.id === id), 'sbx list shows the sandbox created in the console');
  const state = await text(page, `tr[data-id="${id}"] td.state`);
  assert.ok(['running', 'starting', 'stopped'].includes(state), `a state is shown: ${state}`);
  // Once its container runs (the CLI runs a command), the list (refreshed every 3 s)
  // shows it running with its memory use.
  const ex = spawnSync(path.join(bin, 'sbx'), ['--gateway', dev.gateway, 'exec', id, 'true']);
  assert.equal(ex.status, 0, String(ex.stderr));
  await page.waitForFunction((i) => {
    const cells = document.querySelectorAll(`tr[data-id="${i}"] td`);
    return cells[1]?.textContent === 'running' && /\d (B|KiB|MiB|GiB)$/.test(cells[2]?.textContent ?? '');
  }, { timeout: 30000 }, id);
  await shot(page, 'sandboxes');
  await page.click(`button.destroy[data-id="${id}"]`);
  await page.waitForFunction((i) => !document.querySelector(`tr[data-id="${i}"]`), { timeout: 60000 }, id);
  assert.ok(!cli(dev, 'list').sandboxes.some((s) => s.id === id), 'sbx list no longer shows it');
  await page.close();
});

test('terminal: a command typed in shows its output', async () => {
  const id = sb('term');
  cli(dev, 'create', id);
  const page = await newPage(browser);
  await page.goto(`${dev.http}/console/#/sb/${id}/terminal`);
  await page.waitForSelector('#term[data-ready="1"]', { timeout: 60000 });
  await page.click('#term');
  // The output (con-42-ok) is not the text typed, so seeing it means the shell ran it.
  await page.keyboard.type('echo con-$((6*7))-ok\n');
  await page.waitForFunction(() => document.querySelector('#term .xterm-rows')?.textContent.includes('con-42-ok'),
                             { timeout: 30000 });
  await shot(page, 'terminal');
  await page.close();
});

test('terminal: its size follows the window; stty size inside follows a resize', async () => {
  const id = sb('size');
  cli(dev, 'create', id);
  const page = await newPage(browser);
  await page.goto(`${dev.http}/console/#/sb/${id}/terminal`);
  await page.waitForSelector('#term[data-ready="1"]', { timeout: 60000 });
  await page.click('#term');
  const dims = () => page.$eval('#term', (e) => [Number(e.dataset.rows), Number(e.dataset.cols)]);
  // What the shell sees; the output (rows x cols between markers) is not the text typed.
  const stty = async (tag) => {
    await page.keyboard.type(`echo ${tag}-$(stty size | tr ' ' x)-end\n`);
    const h = await page.waitForFunction((t) => {
      const m = document.querySelector('#term .xterm-rows')?.textContent.match(new RegExp(`${t}-(\\d+)x(\\d+)-end`));
      return m && [Number(m[1]), Number(m[2])];
    }, { timeout: 30000 }, tag);
    return h.jsonValue();
  };
  const [r1, c1] = await dims();
  assert.ok(r1 >= 5 && c1 >= 20, `the terminal has a size: ${r1}x${c1}`);
  assert.ok(c1 !== 100 || r1 !== 28, 'the terminal is fitted to the window, not left at 100x28');
  assert.deepEqual(await stty('sz1'), [r1, c1], 'stty size inside is the size sent when it opened');
  await page.setViewport({ width: 760, height: 480 });
  await page.waitForFunction((c) => Number(document.querySelector('#term').dataset.cols) < c, { timeout: 10000 }, c1);
  const [r2, c2] = await dims();
  assert.ok(r2 < r1 && c2 < c1, `a smaller window, a smaller terminal: ${r1}x${c1} -> ${r2}x${c2}`);
  assert.deepEqual(await stty('sz2'), [r2, c2], 'stty size inside follows the resize');
  await shot(page, 'terminal-resized');
  await page.close();
});

test('files: an uploaded file appears in sbx ls; download gives its bytes', async () => {
  const id = sb('files');
  cli(dev, 'create', id);
  const local = path.join(tmp, 'upload-me.txt');
  const content = `uploaded from the console ${process.pid}\n`;
  writeFileSync(local, content);
  const page = await newPage(browser);
  await page.goto(`${dev.http}/console/#/sb/${id}/files`);
  await page.waitForSelector('#file-rows');
  const input = await page.waitForSelector('#upload');
  await input.uploadFile(local);
  await page.waitForSelector('tr[data-name="upload-me.txt"]', { timeout: 30000 });
  const ls = cli(dev, 'ls', id, '/workspace');
  assert.ok(ls.files.some((f) => f.name === 'upload-me.txt' && f.size === Buffer.byteLength(content)),
            'sbx ls shows the uploaded file: ' + JSON.stringify(ls.files.map((f) => f.name)));
  // Download: the browser saves the file it fetched with the API's header.
  const dl = mkdtempSync(path.join(tmp, 'dl-'));
  const cdp = await page.createCDPSession();
  await cdp.send('Browser.setDownloadBehavior', { behavior: 'allow', downloadPath: dl });
  await page.click('tr[data-name="upload-me.txt"] button.download');
  const saved = path.join(dl, 'upload-me.txt');
  for (let i = 0; i < 100 && !existsSync(saved); i++) await sleep(100);
  assert.equal(readFileSync(saved, 'utf8'), content);
  await shot(page, 'files');
  await page.close();
});

test('processes: start one and follow its logs live', async () => {
  const id = sb('proc');
  cli(dev, 'create', id);
  const page = await newPage(browser);
  await page.goto(`${dev.http}/console/#/sb/${id}/processes`);
  await page.waitForSelector('#proc-cmd');
  await page.type('#proc-cmd', 'for i in 1 2 3; do echo tick-$((i*10)); sleep 1; done');
  await page.keyboard.press('Enter');
  // Live: the first line shows while the process still runs (2 s more).
  await page.waitForFunction(() => document.querySelector('#proc-logs')?.textContent.includes('tick-10'),
                             { timeout: 30000 });
  assert.ok(!(await text(page, '#proc-logs')).includes('[exited'), 'the first line came before the end');
  await page.waitForFunction(() => document.querySelector('#proc-logs')?.textContent.includes('tick-30'),
                             { timeout: 30000 });
  await page.waitForFunction(() => document.querySelector('#proc-logs')?.textContent.includes('[exited 0]'),
                             { timeout: 30000 });
  const logs = await text(page, '#proc-logs');
  assert.ok(logs.indexOf('tick-10') < logs.indexOf('tick-20') && logs.indexOf('tick-20') < logs.indexOf('tick-30'), logs);
  await shot(page, 'processes');
  await page.close();
});

test('code cell: a plot shows as a PNG, HTML in a sandboxed iframe', async () => {
  const id = sb('code');
  cli(dev, 'create', id);
  const page = await newPage(browser);
  await page.goto(`${dev.http}/console/#/sb/${id}/code`);
  await page.waitForSelector('#code-src');
  await page.$eval('#code-src', (e) => {
    e.value = 'import matplotlib\nmatplotlib.use("Agg")\nimport matplotlib.pyplot as plt\n' +
              'plt.plot([1, 3, 2])\nplt.show()';
  });
  await page.click('#code-run');
  await page.waitForSelector('#code-out img.png', { timeout: 120000 });
  const dims = await page.$eval('#code-out img.png', async (img) => {
    await img.decode();
    return [img.naturalWidth, img.naturalHeight];
  });
  assert.ok(dims[0] > 100 && dims[1] > 100, `the PNG decodes to a real image: ${dims}`);
  await shot(page, 'code');

  await page.$eval('#code-src', (e) => {
    e.value = 'from IPython.display import HTML\nHTML("<b id=x>bold-" + str(6*7) + "</b>")';
  });
  await page.click('#code-run');
  const frame = await page.waitForSelector('#code-out iframe.html', { timeout: 60000 });
  const info = await frame.evaluate((f) => ({ sandbox: f.getAttribute('sandbox'), doc: f.contentDocument === null,
                                              srcdoc: f.srcdoc }));
  assert.equal(info.sandbox, '', 'an empty sandbox attribute: opaque origin, no scripts');
  assert.ok(info.doc, "the console's scripts cannot reach the output's document (another origin)");
  assert.match(info.srcdoc, /bold-42/);
  await page.close();
});

test('preview links: an exposed port is listed with its URL', async () => {
  const id = sb('ports');
  cli(dev, 'create', id);
  const page = await newPage(browser);
  await page.goto(`${dev.http}/console/#/sb/${id}/ports`);
  await page.waitForSelector('#port-num');
  await page.type('#port-num', '8123');
  await page.keyboard.press('Enter');
  const a = await page.waitForSelector('tr[data-port="8123"] a.preview', { timeout: 30000 });
  const [href, rel] = await a.evaluate((e) => [e.href, e.rel]);
  assert.match(href, new RegExp(`^http://8123-${id}-[a-z0-9_]+\\.`));
  assert.equal(rel, 'noopener noreferrer');
  await shot(page, 'ports');
  await page.close();
});

test('keys on: without a key the console sees nothing; with it, the sandboxes', async () => {
  const key = 'console-test-key-' + Math.random().toString(36).slice(2);
  const keys = path.join(tmp, 'api-keys');
  writeFileSync(keys, key + '\n');
  const kd = await startDaemon('keys', ['--console', '--api-keys', keys], key);
  const id = sb('keyed');
  const r = await fetch(`${kd.http}/v1/sandboxes/${id}`, { method: 'PUT', headers: { Authorization: `Bearer ${key}` } });
  assert.equal(r.status, 200, await r.text());
  const page = await newPage(browser);
  await page.goto(`${kd.http}/console/`);
  await page.waitForFunction(() => document.querySelector('#list-status')?.textContent.includes('API key'));
  assert.equal(await page.$$eval('#sandbox-rows tr', (rows) => rows.length), 0, 'no sandbox shown without a key');
  assert.equal(await page.evaluate(() => sessionStorage.length), 0);
  await page.type('#key', key);
  await page.click('#keyform button[type=submit]');
  await page.waitForSelector(`tr[data-id="${id}"]`, { timeout: 30000 });
  assert.ok(!page.url().includes(key), 'the key is never in the page\'s URL');
  await shot(page, 'keyed');
  // The terminal's WebSocket authenticates too (browsers cannot set its headers).
  await page.goto(`${kd.http}/console/#/sb/${id}/terminal`);
  await page.waitForSelector('#term[data-ready="1"]', { timeout: 60000 });
  await page.click('#term');
  await page.keyboard.type('echo keyed-$((6*7))\n');
  await page.waitForFunction(() => document.querySelector('#term .xterm-rows')?.textContent.includes('keyed-42'),
                             { timeout: 30000 });
  await page.close();
  await fetch(`${kd.http}/v1/sandboxes/${id}`, { method: 'DELETE', headers: { Authorization: `Bearer ${key}` } });
  await stopDaemon(kd);
});

test('without --console, /console/ is a 404', async () => {
  const off = await startDaemon('off', []);
  for (const p of ['/console/', '/console/app.js']) {
    const r = await fetch(off.http + p);
    assert.equal(r.status, 404, p);
    assert.equal((await r.json()).code, 'ROUTE_NOT_FOUND');
  }
  const on = await fetch(`${dev.http}/console/app.js`);
  assert.equal(on.status, 200);
  assert.equal(on.headers.get('content-type'), 'text/javascript; charset=utf-8');
  assert.equal(on.headers.get('x-content-type-options'), 'nosniff');
  assert.match(on.headers.get('content-security-policy'), /script-src 'self';/);
  await stopDaemon(off);
});
