// Code interpreter: Python (rich outputs), JavaScript, TypeScript contexts.
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';

import { ContextNotFoundError, ValidationFailedError } from '../dist/index.js';
import { useDaemon } from './helpers.mjs';

const ctx = useDaemon();

describe('code interpreter', () => {
  it('runs Python: values, state, exceptions and matplotlib charts', async () => {
    const sb = ctx.sandbox('py');
    const two = await sb.runCode('1+1');
    assert.equal(two.results[0].text, '2');
    assert.equal(two.results[0].isMainResult, true);
    assert.equal(two.error, undefined);

    const pyctx = await sb.createCodeContext({ language: 'python' });
    assert.equal(pyctx.language, 'python');
    assert.ok(pyctx.createdAt instanceof Date);
    await sb.runCode('x = 20\nprint("set")', { context: pyctx });
    const x = await sb.runCode('x * 2 + 2', { context: pyctx });
    assert.equal(x.results[0].text, '42');

    const printed = await sb.runCode('print("hello"); import sys; print("warn", file=sys.stderr)', { context: pyctx });
    assert.deepEqual(printed.logs.stdout.join(''), 'hello\n');
    assert.deepEqual(printed.logs.stderr.join(''), 'warn\n');

    const boom = await sb.runCode('raise ValueError("boom")', { context: pyctx });
    assert.equal(boom.error.name, 'ValueError');
    assert.equal(boom.error.value, 'boom');
    assert.equal(boom.error.message, 'boom');
    assert.ok(boom.error.traceback.length > 0);

    const chart = await sb.runCode('import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.title("t")\nplt.show()', {
      context: pyctx,
      timeout: 120_000,
    });
    const png = chart.results.find((r) => r.png);
    assert.ok(png, `a PNG result: ${JSON.stringify(chart.results.map((r) => Object.keys(r)))}`);
    assert.equal(Buffer.from(png.png, 'base64').subarray(1, 4).toString(), 'PNG');
  });

  it('runs JavaScript and TypeScript cells', async () => {
    const sb = ctx.sandbox('js');
    const js = await sb.runCode('const a = [1, 2, 3];\na.map((v) => v * 2)', { language: 'javascript' });
    assert.equal(js.results[0].text, '[ 2, 4, 6 ]');
    assert.deepEqual(js.results[0].json, [2, 4, 6]);
    const jsState = await sb.runCode('a.length', { language: 'javascript' });
    assert.equal(jsState.results[0].text, '3');
    const logged = await sb.runCode('console.log("from js"); 5', { language: 'js' });
    assert.equal(logged.logs.stdout.join(''), 'from js\n');

    const tsctx = await sb.createCodeContext({ language: 'typescript' });
    const ts = await sb.runCode('interface P { n: number }\nconst p: P = { n: 40 };\np.n + 2', { context: tsctx });
    assert.equal(ts.results[0].text, '42');
    const err = await sb.runCode('throw new TypeError("bad")', { context: tsctx });
    assert.equal(err.error.name, 'TypeError');
  });

  it('streams a cell, lists and deletes contexts', async () => {
    const sb = ctx.sandbox('ctxs');
    const c = await sb.createCodeContext({ language: 'python' });
    const events = await (await sb.runCodeStream('print("a")\n7*6', { context: c })).toArray();
    const types = events.map((e) => e.type);
    assert.ok(types.includes('stdout'), types.join(','));
    assert.equal(events.find((e) => e.type === 'result').result.text, '42');
    assert.equal(types.at(-1), 'execution_complete');

    const seen = { out: [], results: [] };
    const exec = await sb.runCode('print("cb")\n"value"', {
      context: c.id,
      onStdout: (o) => seen.out.push(o.text),
      onResult: (r) => seen.results.push(r.text),
    });
    assert.deepEqual(seen.out, ['cb\n']);
    assert.deepEqual(seen.results, ["'value'"]);
    assert.equal(exec.results[0].text, "'value'");

    assert.ok((await sb.listCodeContexts()).some((x) => x.id === c.id));
    await sb.deleteCodeContext(c);
    assert.ok(!(await sb.listCodeContexts()).some((x) => x.id === c.id));
    await assert.rejects(sb.deleteCodeContext(c.id), ContextNotFoundError);
    await assert.rejects(sb.runCode('1', { context: c.id }), (err) => {
      assert.ok(err instanceof ContextNotFoundError);
      assert.equal(err.httpStatus, 404);
      return true;
    });
    await assert.rejects(sb.createCodeContext({ language: 'cobol' }), ValidationFailedError);
  });
});
