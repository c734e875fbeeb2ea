// The OpenAPI document (gateway/openapi.json, generated from runtime/ops.yaml
// by tools/gen_ops.py): a valid OpenAPI 3.1 document by a real validator,
// every JSON Schema in it compiles under JSON Schema 2020-12, sbxd serves
// exactly it, and real answers of a running sbxd match its result schemas
// (an undeclared field counts as a mismatch: a schema that lies fails here).
//
// Needs SBX_TEST_URL (run.mjs starts a private daemon and sets it).
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { test } from 'node:test';

import { Validator } from '@seriousme/openapi-schema-validator';
import Ajv2020 from 'ajv/dist/2020.js';
import addFormats from 'ajv-formats';

import { repo } from './daemon.mjs';

// SBX_OPENAPI_DOC: check another document (e.g. a deliberately wrong one, to see the test fail).
const docPath = process.env.SBX_OPENAPI_DOC ?? path.join(repo, 'gateway/openapi.json');
const doc = JSON.parse(readFileSync(docPath, 'utf8'));
const base = process.env.SBX_TEST_URL;
const DOC_ID = 'https://sbx.invalid/openapi.json';

/** A copy of `s` where every object schema with `properties` and no
 * `additionalProperties` gets `additionalProperties: false`: for checking
 * answers, a field the document does not declare is a lie by omission. */
function closed(s) {
  if (Array.isArray(s)) return s.map(closed);
  if (!s || typeof s !== 'object') return s;
  const o = {};
  for (const [k, v] of Object.entries(s)) o[k] = k === 'properties' || k === '$defs' || k === 'schemas' ? Object.fromEntries(Object.entries(v).map(([n, x]) => [n, closed(x)])) : closed(v);
  if (o.properties && !('additionalProperties' in o) && !('unevaluatedProperties' in o) && !o.allOf && !o.oneOf && !o.anyOf) o.additionalProperties = false;
  return o;
}

function newAjv(strict) {
  const ajv = new Ajv2020({ strict, allErrors: true, validateFormats: true, allowUnionTypes: true });
  addFormats.default ? addFormats.default(ajv) : addFormats(ajv);
  return ajv;
}
const ajv = newAjv(false);
ajv.addSchema({ $id: DOC_ID, ...closed(doc) }, DOC_ID);

const ptr = (...parts) => parts.map((p) => encodeURIComponent(String(p).replace(/~/g, '~0').replace(/\//g, '~1'))).join('/');

/** The validator of the JSON answer of METHOD TEMPLATE with STATUS ('200' or 'default'). */
function responseValidator(method, template, status = '200') {
  const op = doc.paths?.[template]?.[method.toLowerCase()];
  assert.ok(op, `${method} ${template} is not in the document`);
  const r = op.responses?.[status];
  assert.ok(r?.content?.['application/json']?.schema, `${method} ${template}: no JSON schema for ${status}`);
  return ajv.getSchema(`${DOC_ID}#/${ptr('paths', template, method.toLowerCase(), 'responses', status, 'content', 'application/json', 'schema')}`)
    ?? ajv.compile({ $ref: `${DOC_ID}#/${ptr('paths', template, method.toLowerCase(), 'responses', status, 'content', 'application/json', 'schema')}` });
}

/** The validator of the JSON request body of METHOD TEMPLATE. */
function requestValidator(method, template) {
  return ajv.compile({ $ref: `${DOC_ID}#/${ptr('paths', template, method.toLowerCase(), 'requestBody', 'content', 'application/json', 'schema')}` });
}

async function call(method, route, body, headers = {}) {
  // X-Sbx-Client: what the keyless front requires of mutating requests (docs/http.md).
  const init = { method, headers: { 'x-sbx-client': 'openapi-tests', ...headers } };
  if (body !== undefined) {
    init.body = JSON.stringify(body);
    init.headers['content-type'] = 'application/json';
  }
  const r = await fetch(base + route, init);
  const text = await r.text();
  let json;
  try {
    json = JSON.parse(text);
  } catch {
    json = undefined;
  }
  return { status: r.status, type: r.headers.get('content-type') ?? '', text, json };
}

/** The schema an answer's top level is checked against (refs followed). */
function topSchema(method, template) {
  let s = doc.paths[template][method.toLowerCase()].responses['200'].content['application/json'].schema;
  while (s?.$ref) s = doc.components.schemas[s.$ref.split('/').pop()];
  return s;
}

/** Members of the answers that the document does not list (where it allows
 * unlisted ones): reported, so the schema can catch up. */
export const undeclared = new Map();

/** Check a real answer against the document: status 200 and the result schema. */
async function expectMatches(method, template, route, body) {
  const r = await call(method, route, body);
  assert.equal(r.status, 200, `${method} ${route}: ${r.status} ${r.text.slice(0, 300)}`);
  const v = responseValidator(method, template);
  assert.ok(v(r.json), `${method} ${route}: the answer does not match the document's schema: ${ajv.errorsText(v.errors)}\nanswer: ${r.text.slice(0, 600)}`);
  const top = topSchema(method, template);
  if (top?.properties && r.json && typeof r.json === 'object') {
    const extra = Object.keys(r.json).filter((k) => !(k in top.properties));
    if (extra.length) undeclared.set(`${method} ${template}`, extra);
  }
  return r.json;
}

const sb = `oapi-${process.pid}-${Math.random().toString(36).slice(2, 8)}`;
const S = (op) => `/v1/sandboxes/${sb}/${op}`;
const T = (op) => `/v1/sandboxes/{sandbox}/${op}`;

test('a valid OpenAPI 3.1 document (@seriousme/openapi-schema-validator)', async () => {
  assert.match(doc.openapi, /^3\.1\./);
  assert.equal(doc.jsonSchemaDialect ?? 'https://spec.openapis.org/oas/3.1/dialect/base', 'https://spec.openapis.org/oas/3.1/dialect/base');
  const validator = new Validator();
  const res = await validator.validate(structuredClone(doc));
  assert.ok(res.valid, `not a valid OpenAPI document: ${JSON.stringify(res.errors ?? null, null, 1).slice(0, 3000)}`);
  assert.equal(validator.version, '3.1');
});

test('every schema of the document compiles under JSON Schema 2020-12 (strict)', () => {
  const strict = newAjv(true);
  strict.addKeyword('x-unit');
  const schemas = [];
  for (const [name, s] of Object.entries(doc.components?.schemas ?? {})) schemas.push([`#/components/schemas/${name}`, s]);
  const fix = (x) => JSON.parse(JSON.stringify(x).replaceAll('"#/components/schemas/', `"${DOC_ID}/c#/$defs/`));
  strict.addSchema({ $id: DOC_ID + '/c', $defs: fix(doc.components?.schemas ?? {}) });
  for (const [p, item] of Object.entries(doc.paths))
    for (const [m, op] of Object.entries(item)) {
      for (const [code, r] of Object.entries(op.responses ?? {}))
        for (const [ct, c] of Object.entries(r.content ?? {})) if (c.schema) schemas.push([`${m} ${p} ${code} ${ct}`, c.schema]);
      for (const [ct, c] of Object.entries(op.requestBody?.content ?? {})) if (c.schema) schemas.push([`${m} ${p} request ${ct}`, c.schema]);
    }
  let n = 0;
  for (const [where, s] of schemas) {
    assert.doesNotThrow(() => strict.compile(fix(s)), `${where}: not a valid 2020-12 schema`);
    n++;
  }
  assert.ok(n > 50, `only ${n} schemas`);
});

test('every operation route has typed bodies and results', () => {
  let typed = 0;
  for (const [p, item] of Object.entries(doc.paths))
    for (const [m, op] of Object.entries(item)) {
      if (op.security) assert.ok(op.responses?.default?.content?.['application/json']?.schema, `${m} ${p}: no error response`);
      const ok = op.responses['200'] ?? op.responses['101'];
      assert.ok(ok, `${m} ${p}: no success response`);
      const js = ok.content?.['application/json']?.schema;
      if (js && op.security) {
        assert.notDeepEqual(js, { type: 'object' }, `${m} ${p}: an untyped result`);
        typed++;
      }
      const body = op.requestBody?.content?.['application/json']?.schema;
      if (body) assert.notEqual(body.additionalProperties, true, `${m} ${p}: an untyped body`);
    }
  assert.ok(typed > 50, `only ${typed} typed results`);
});

test('sbxd serves this document at GET /v1/openapi.json', async () => {
  const r = await call('GET', '/v1/openapi.json');
  assert.equal(r.status, 200);
  assert.match(r.type, /application\/json/);
  assert.deepEqual(r.json, doc, 'the served document differs from gateway/openapi.json (make gen, then rebuild)');
});

test('real answers match the result schemas', async (t) => {
  try {
    await t.test('create', () => expectMatches('PUT', '/v1/sandboxes/{sandbox}', `/v1/sandboxes/${sb}`, {}));
    await t.test('exec', async () => {
      const r = await expectMatches('POST', T('exec'), S('exec'), { command: 'echo hi; echo err >&2' });
      assert.equal(r.stdout, 'hi\n');
      assert.equal(r.exitCode, 0);
    });
    await t.test('exec with a timeout', () => expectMatches('POST', T('exec'), S('exec'), { command: 'sleep 5', timeout: 200 }));
    await t.test('file.write', () => expectMatches('POST', T('file.write'), S('file.write'), { path: '/workspace/a.txt', content: 'hello' }));
    await t.test('file.read', async () => {
      const r = await expectMatches('POST', T('file.read'), S('file.read'), { path: '/workspace/a.txt' });
      assert.equal(r.content, 'hello');
    });
    await t.test('file.list', () => expectMatches('POST', T('file.list'), S('file.list'), { path: '/workspace' }));
    await t.test('file.exists', () => expectMatches('POST', T('file.exists'), S('file.exists'), { path: '/workspace/a.txt' }));
    await t.test('file.checkChanges', async () => {
      const first = await expectMatches('POST', T('file.checkChanges'), S('file.checkChanges'), { path: '/workspace' });
      await expectMatches('POST', T('file.checkChanges'), S('file.checkChanges'), { path: '/workspace', since: first.version });
      await expectMatches('POST', T('file.checkChanges'), S('file.checkChanges'), { path: '/workspace', since: 'watch-0-0:0' });
    });
    await t.test('status', () => expectMatches('GET', '/v1/sandboxes/{sandbox}', `/v1/sandboxes/${sb}`));
    await t.test('session.create', () => expectMatches('POST', T('session.create'), S('session.create'), { id: 'oapi-s1' }));
    await t.test('session.get', () => expectMatches('GET', T('sessions/{id}'), S('sessions/oapi-s1')));
    await t.test('session.list', () => expectMatches('GET', T('sessions'), S('sessions')));
    await t.test('process.start', () => expectMatches('POST', T('process.start'), S('process.start'), { command: 'echo started; sleep 30', processId: 'oapi-p1' }));
    await t.test('process.waitForLog', () => expectMatches('POST', T('process.waitForLog'), S('process.waitForLog'), { processId: 'oapi-p1', pattern: 'started', timeout: 20000 }));
    await t.test('process.list', () => expectMatches('GET', T('processes'), S('processes')));
    await t.test('process.get', () => expectMatches('GET', T('processes/{processId}'), S('processes/oapi-p1')));
    await t.test('process.logs', () => expectMatches('GET', T('processes/{processId}/logs'), S('processes/oapi-p1/logs')));
    await t.test('process.kill', () => expectMatches('DELETE', T('processes/{processId}'), S('processes/oapi-p1')));
    await t.test('context.create', () => expectMatches('POST', T('context.create'), S('context.create'), { language: 'python' }));
    await t.test('context.run (interpreter)', async () => {
      const r = await expectMatches('POST', T('context.run'), S('context.run'), { code: 'print("x")\n1 + 1', language: 'python' });
      assert.deepEqual(r.logs?.stdout?.join(''), 'x\n');
    });
    await t.test('context.run raising', () => expectMatches('POST', T('context.run'), S('context.run'), { code: 'raise ValueError("no")', language: 'python' }));
    await t.test('context.list', () => expectMatches('GET', T('contexts'), S('contexts')));
    await t.test('port.expose', () => expectMatches('POST', T('port.expose'), S('port.expose'), { port: 8080 }));
    await t.test('port.list', () => expectMatches('GET', T('ports'), S('ports')));
    await t.test('env.set', () => expectMatches('POST', T('env.set'), S('env.set'), { vars: { A: '1', B: null } }));
    await t.test('ping', () => expectMatches('POST', T('ping'), S('ping'), {}));
    await t.test('list', () => expectMatches('GET', '/v1/sandboxes', '/v1/sandboxes'));
    await t.test('cluster.status', () => expectMatches('GET', '/v1/cluster', '/v1/cluster'));
    await t.test('an error matches the Error schema', async () => {
      const r = await call('POST', S('file.read'), { path: '/workspace/no-such-file' });
      assert.notEqual(r.status, 200);
      const v = responseValidator('POST', T('file.read'), 'default');
      assert.ok(v(r.json), `${ajv.errorsText(v.errors)}: ${r.text}`);
      assert.equal(r.json.code, 'FILE_NOT_FOUND');
    });
    await t.test('a body the schema refuses is refused by sbxd too', async () => {
      const body = { command: 'echo x', timeout: 'soon' };
      const v = requestValidator('POST', T('exec'));
      assert.equal(v(body), false, 'the request schema accepts a string timeout');
      assert.ok(v({ command: 'echo x', timeout: 1000 }), `a good body refused: ${ajv.errorsText(v.errors)}`);
      const r = await call('POST', S('exec'), body);
      assert.equal(r.status, 400, r.text);
      assert.equal(r.json.code, 'VALIDATION_FAILED');
    });
    await t.test('a stream op answers text/event-stream', async () => {
      const op = doc.paths[T('exec.stream')].post;
      assert.ok(op.responses['200'].content['text/event-stream'], 'exec.stream declares no text/event-stream answer');
      const r = await call('POST', S('exec.stream'), { command: 'echo streamed' }, { accept: 'text/event-stream' });
      assert.equal(r.status, 200);
      assert.match(r.type, /text\/event-stream/);
      assert.match(r.text, /streamed/);
    });
  } finally {
    await call('DELETE', `/v1/sandboxes/${sb}`);
    for (const [k, v] of undeclared) t.diagnostic(`${k}: answered members the document does not list: ${v.join(', ')}`);
  }
});
