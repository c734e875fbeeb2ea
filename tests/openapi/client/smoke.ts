// Smoke test of a client generated from gateway/openapi.json by real
// generators: openapi-typescript writes the types (schema.d.ts, next to this
// file in the build directory), openapi-fetch is the client.  Compiled with
// tsc --strict: a result schema that does not type these fields fails the
// build.  Run against a running sbxd: SBX_URL=http://127.0.0.1:PORT.
// Exit status 0 only if every step answered what it should.
import createClient from 'openapi-fetch';
import type { paths } from './schema.js';

const baseUrl = process.env.SBX_URL;
if (!baseUrl) throw new Error('set SBX_URL');
// X-Sbx-Client: what the keyless front requires of mutating requests (docs/http.md).
const api = createClient<paths>({ baseUrl, headers: { 'X-Sbx-Client': 'openapi-smoke' } });
const sandbox = `oapi-smoke-${process.pid}`;
const path = { sandbox };

function check(what: string, cond: boolean, detail: unknown): void {
  if (!cond) throw new Error(`${what}: ${JSON.stringify(detail)}`);
  console.log(`ok - ${what}`);
}

try {
  const created = await api.PUT('/v1/sandboxes/{sandbox}', { params: { path } });
  check('create', !created.error, created.error);

  const ran = await api.POST('/v1/sandboxes/{sandbox}/exec', { params: { path }, body: { command: 'echo hi' } });
  if (ran.error) throw new Error(`exec: ${ran.error.code}: ${ran.error.message}`);
  const stdout: string = ran.data.stdout;
  const exitCode: number = ran.data.exitCode;
  check('exec echo hi', stdout === 'hi\n' && exitCode === 0, ran.data);

  const wrote = await api.POST('/v1/sandboxes/{sandbox}/file.write', {
    params: { path },
    body: { path: '/workspace/smoke.txt', content: 'from a generated client' },
  });
  check('file.write', !wrote.error, wrote.error);

  const read = await api.POST('/v1/sandboxes/{sandbox}/file.read', { params: { path }, body: { path: '/workspace/smoke.txt' } });
  if (read.error) throw new Error(`file.read: ${read.error.code}: ${read.error.message}`);
  const content: string = read.data.content;
  check('file.read', content === 'from a generated client', read.data);

  const missing = await api.POST('/v1/sandboxes/{sandbox}/file.read', { params: { path }, body: { path: '/workspace/nothing-here' } });
  const code: string | undefined = missing.error?.code;
  check('file.read of a missing file is FILE_NOT_FOUND', code === 'FILE_NOT_FOUND', missing.error);
} finally {
  const gone = await api.DELETE('/v1/sandboxes/{sandbox}', { params: { path } });
  check('destroy', !gone.error, gone.error);
}
