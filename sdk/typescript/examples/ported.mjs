// A program written for @cloudflare/sandbox, ported to sbx by changing two
// lines: the import, and the getSandbox() call (an SbxClient instead of the
// Durable Object namespace). Everything else is unchanged.
//
//   SBX_URL=http://127.0.0.1:7780 node examples/ported.mjs
//
// Cloudflare:
//   import { getSandbox, parseSSEStream, FileNotFoundError } from '@cloudflare/sandbox';
//   const sandbox = getSandbox(env.Sandbox, sandboxId, { sleepAfter: '5m' });
import { getSandbox, parseSSEStream, FileNotFoundError, SbxClient } from '@sbx/sandbox';

export async function demo(sandboxId) {
  const sandbox = getSandbox(new SbxClient(), sandboxId, { sleepAfter: '5m' });
  const log = [];

  // Files and commands.
  await sandbox.writeFile('/workspace/hello.py', 'import sys\nprint("Hello from", sys.argv[1])\n');
  const result = await sandbox.exec('python3 /workspace/hello.py sbx');
  log.push(`exec: exit ${result.exitCode}, stdout ${JSON.stringify(result.stdout)}`);

  // Streaming output.
  const stream = await sandbox.execStream('for i in 1 2 3; do echo "step $i"; sleep 0.1; done');
  for await (const event of parseSSEStream(stream)) {
    if (event.type === 'stdout') log.push(`stream: ${event.data.trim()}`);
    if (event.type === 'complete') log.push(`stream: done, exit ${event.exitCode}`);
  }

  // A background server and its preview URL.
  const server = await sandbox.startProcess('python3 -m http.server 8000', { processId: 'web' });
  await server.waitForPort(8000, { timeout: 20000 });
  const { url } = await sandbox.exposePort(8000, { hostname: 'localhost' });
  log.push(`preview: ${url.replace(/-[a-z0-9_]{16}\./, '-<token>.')}`);
  await server.kill();

  // Code interpreter.
  const execution = await sandbox.runCode('sum(range(10))');
  log.push(`runCode: ${execution.results[0]?.text}`);

  // Sessions keep state.
  const session = await sandbox.createSession({ id: 'build', cwd: '/tmp' });
  await session.exec('export STAGE=two && cd /var');
  log.push(`session: ${(await session.exec('echo $STAGE $(pwd)')).stdout.trim()}`);

  // Errors are classes.
  try {
    await sandbox.readFile('/workspace/missing.txt');
  } catch (error) {
    if (error instanceof FileNotFoundError) log.push(`error: ${error.code} ${error.httpStatus}`);
  }

  await sandbox.destroy();
  return log;
}

if (import.meta.url === `file://${process.argv[1]}`) {
  for (const line of await demo(process.argv[2] ?? `demo-${process.pid}`)) console.log(line);
}
