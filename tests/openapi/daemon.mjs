// A private `sbxd dev` for the OpenAPI tests: a fresh data directory under
// /tmp, an HTTP front on a free loopback port, stopped (by its pid) and its
// directory removed by stop().  Binary: $SBX_BIN (a directory holding sbxd,
// or the binary), default <repo>/bin.
import { spawn } from 'node:child_process';
import { closeSync, existsSync, mkdtempSync, openSync, readFileSync, rmSync, statSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

export const here = path.dirname(fileURLToPath(import.meta.url));
export const repo = path.resolve(here, '../..');
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

function sbxdPath() {
  const bin = process.env.SBX_BIN ? path.resolve(process.env.SBX_BIN) : path.join(repo, 'bin');
  const p = existsSync(bin) && statSync(bin).isDirectory() ? path.join(bin, 'sbxd') : bin;
  if (!existsSync(p)) throw new Error(`sbxd not found at ${p} (set SBX_BIN; build it with make)`);
  return p;
}

/** Start the daemon; resolves with {url, pid, dataDir, logPath, stop()}. */
export async function startDaemon() {
  const mark = /^[a-z0-9]{1,8}$/.test(process.env.SBX_TEST_PREFIX ?? '') ? process.env.SBX_TEST_PREFIX : '';
  const dataDir = mkdtempSync(`/tmp/sbx-oapi-${mark}`);
  const name = 'oa' + mark + Math.random().toString(36).slice(2, 10).replace(/[^a-z]/g, 'x');
  const logPath = path.join(dataDir, 'sbxd.log');
  const fd = openSync(logPath, 'a');
  const child = spawn(
    sbxdPath(),
    ['dev', '--data', dataDir, '--listen', `ipc://${dataDir}/gw.sock`, '--name', name, '--http', '127.0.0.1:0', '--pool', '1'],
    { stdio: ['ignore', fd, fd] },
  );
  closeSync(fd);
  let exited = null;
  const exitPromise = new Promise((resolve) => child.once('exit', (code, sig) => resolve((exited = { code, sig }))));
  const stop = async () => {
    if (!exited) {
      child.kill('SIGTERM');
      const t = setTimeout(() => child.kill('SIGKILL'), 20_000);
      await exitPromise;
      clearTimeout(t);
    }
    rmSync(dataDir, { recursive: true, force: true, maxRetries: 3 });
  };
  const addrFile = path.join(dataDir, 'http.addr');
  let url;
  for (const deadline = Date.now() + 30_000; Date.now() < deadline && !exited; await sleep(50)) {
    const addr = existsSync(addrFile) ? readFileSync(addrFile, 'utf8').trim() : '';
    if (!addr) continue;
    try {
      const r = await fetch(`http://${addr}/v1/health`);
      if (r.ok) {
        url = `http://${addr}`;
        break;
      }
    } catch {
      /* not up yet */
    }
  }
  if (!url) {
    const tail = existsSync(logPath) ? readFileSync(logPath, 'utf8').slice(-2000) : '';
    await stop();
    throw new Error(`sbxd did not come up (exit ${JSON.stringify(exited)}):\n${tail}`);
  }
  return { url, pid: child.pid, dataDir, logPath, stop, get exited() { return exited; } };
}
