// Runs the test files against one private sbx daemon: starts `sbxd dev`
// (binary from $SBX_BIN, default <repo>/bin), runs `node --test` with
// SBX_TEST_URL pointing at it, stops the daemon and removes its data
// directory. Exit status: the test runner's.
//
//   node test/run.mjs                 # every test/*.test.mjs
//   node test/run.mjs test/exec.test.mjs
import { spawn } from 'node:child_process';
import { existsSync, readFileSync, readdirSync } from 'node:fs';
import path from 'node:path';

import { packageDir, startDaemon } from './helpers.mjs';

const args = process.argv.slice(2);
const files = args.length
  ? args
  : readdirSync(path.join(packageDir, 'test'))
      .filter((f) => f.endsWith('.test.mjs'))
      .sort()
      .map((f) => path.join('test', f));

const t0 = Date.now();
const daemon = await startDaemon();
console.log(`# sbxd dev pid ${daemon.pid} at ${daemon.url} (data ${daemon.dataDir})`);

let child;
let stopping = false;
async function shutdown(code) {
  if (stopping) return;
  stopping = true;
  if (daemon.exited) {
    console.log(`# sbxd DIED during the tests (exit code ${daemon.exited.code}, signal ${daemon.exited.sig}): the failures after that point are its, see its log below`);
    if (code === 0) code = 1;
  }
  if (code !== 0 && existsSync(daemon.logPath)) {
    const log = readFileSync(daemon.logPath, 'utf8').split('\n').filter((l) => !l.startsWith('Failed to send'));
    console.log('# last lines of the daemon log:\n' + log.slice(-40).map((l) => '#   ' + l).join('\n'));
  }
  await daemon.stop();
  console.log(`# daemon stopped; total ${((Date.now() - t0) / 1000).toFixed(1)} s`);
  process.exit(code);
}
for (const sig of ['SIGINT', 'SIGTERM', 'SIGHUP']) {
  process.on(sig, () => {
    if (child && child.exitCode === null) child.kill('SIGTERM');
    void shutdown(130);
  });
}

child = spawn(
  process.execPath,
  ['--test', '--test-concurrency=2', '--test-timeout=120000', '--test-reporter=spec', ...files],
  { cwd: packageDir, stdio: 'inherit', env: { ...process.env, SBX_TEST_URL: daemon.url } },
);
child.on('exit', (code, signal) => void shutdown(code ?? (signal ? 1 : 0)));
