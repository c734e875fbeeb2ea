// Starts a private sbxd, runs document.test.mjs (node:test) and the compiled
// smoke test of the generated client (argv[2]) against it, stops it.
// Exit status 0 only if both passed.
import { spawnSync } from 'node:child_process';
import { existsSync, readFileSync } from 'node:fs';
import path from 'node:path';

import { here, startDaemon } from './daemon.mjs';

const smoke = process.argv[2];
const t0 = Date.now();
const daemon = await startDaemon();
console.log(`# sbxd dev pid ${daemon.pid} at ${daemon.url}`);
let rc = 1;
let stopping = false;
async function shutdown(code) {
  if (stopping) return;
  stopping = true;
  if (code !== 0 && existsSync(daemon.logPath))
    console.log('# last lines of the daemon log:\n' + readFileSync(daemon.logPath, 'utf8').split('\n').slice(-30).map((l) => '#   ' + l).join('\n'));
  await daemon.stop();
  console.log(`# daemon stopped; total ${((Date.now() - t0) / 1000).toFixed(1)} s`);
  process.exit(code);
}
for (const sig of ['SIGINT', 'SIGTERM', 'SIGHUP']) process.on(sig, () => void shutdown(130));
try {
  const env = { ...process.env, SBX_TEST_URL: daemon.url, SBX_URL: daemon.url };
  const a = spawnSync(process.execPath, ['--test', '--test-timeout=240000', '--test-reporter=spec', path.join(here, 'document.test.mjs')], { stdio: 'inherit', env, cwd: here });
  console.log('# generated client smoke test');
  const b = smoke ? spawnSync(process.execPath, [smoke], { stdio: 'inherit', env, cwd: here }) : { status: 0 };
  rc = a.status === 0 && b.status === 0 ? 0 : 1;
} finally {
  await shutdown(rc);
}
