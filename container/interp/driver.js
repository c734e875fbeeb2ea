'use strict';
/*
 * sbx code-interpreter driver for JavaScript and TypeScript (Node >= 20, CommonJS).
 *
 * One driver process = one code context: the context's state is this process's global object.
 * Started by the in-sandbox agent as
 *
 *     NODE_NO_WARNINGS=1 node driver.js javascript|typescript
 *
 * File descriptors
 *   0  /dev/null
 *   1  pipe read by the agent: fd-level output only (child processes with stdio 'inherit', fs.writeSync(1)).
 *      The driver never creates Node's own stdout stream for it (that would switch the shared pipe to
 *      O_NONBLOCK under children); process.stdout is replaced by an event-emitting stream instead.
 *   2  same for stderr.
 *   3  requests, JSON Lines (read).
 *   4  events, JSON Lines (written with synchronous writes, so events keep their order and are on
 *      the pipe before anything that follows, even if the process is killed right after).
 *
 * Requests (one JSON object per line, handled strictly one at a time in arrival order)
 *   {"type":"init","id","cwd"?,"env"?:{K:v},"language"?}
 *                                             chdir + merge env (null deletes), rebind require/module to
 *                                             the cwd, switch to `language` (the agent keeps warm drivers
 *                                             for both; TypeScript's transpiler is loaded here, before
 *                                             done)  →  done{status:"ok"|"error"}
 *   {"type":"execute","id","code"}            run one cell  →  events…, done{status, execution_count}
 *
 * Events (every event but "ready" carries the request's id; output produced between cells — timers,
 * late rejections — carries the id of the most recent execute, or null before the first one)
 *   {"type":"ready","pid","language","mode":"node","version"}                      once, at start
 *   {"type":"stream","id","name":"stdout"|"stderr","text"}                         as produced
 *   {"type":"display_data","id","data":{mime:value},"metadata":{}}                 display(value[, mime])
 *   {"type":"execute_result","id","execution_count","data":{…},"metadata":{}}     last value, if defined
 *   {"type":"error","id","ename","evalue","traceback":[…]}
 *   {"type":"done","id","status":"ok"|"error"|"aborted","execution_count"?}        always last
 *
 * Status "error" means the cell (or init) failed, including a cell interrupted by SIGINT (its error event
 * has ename "InterruptError"), as in Jupyter and the Python driver; the agent flags interrupts itself.
 * "aborted" is part of the shared vocabulary but this driver never emits it.
 *
 * Cell semantics (see compileCell → rewriteCell for the transform itself)
 *   - Code runs in the main realm (vm.Script#runInThisContext) so every built-in (fetch, URL, …) is the
 *     real one. Top-level let/const/class (and, in await cells, var/function) are rewritten into
 *     assignments to `var`-style globals, so any declaration can be re-run by a later cell.
 *   - Top-level await: the cell is wrapped in an async arrow function; its last expression is returned.
 *   - A promise (any thenable) as the cell's value is awaited and its value is the result, a rejection
 *     the cell's error — as the Cloudflare SDK's executor (whose async wrapper returns the value) and
 *     Jupyter's JavaScript kernels do; `import("fs").then(m => …)` gives the module's answer, not
 *     `Promise { <pending> }`. A promise stored in a variable is left alone.
 *   - TypeScript: sucrase "typescript" transform (types erased, no checking), then — only if the cell has
 *     static import/export — sucrase's "imports" transform (import → require); the two passes equal
 *     transforms ['typescript','imports'] but let the driver copy imported names onto globalThis so
 *     later cells see them. JavaScript cells with import/export take the second pass only.
 *   - process.exit() throws a ProcessExit error instead of exiting: exiting would kill the context's state
 *     in the middle of a request. process.abort() and signals other than SIGINT still end the process.
 *   - SIGINT interrupts the running cell (sync code via breakOnSigint, a pending await via a race) and is
 *     ignored while idle. Limitation: synchronous code running outside runInThisContext (after an await,
 *     in a timer callback) cannot be interrupted; the agent has to kill the process.
 *   - EOF on fd 3: the driver finishes the requests already received and exits with status 0.
 */

const fs = require('node:fs');
const net = require('node:net');
const path = require('node:path');
const util = require('node:util');
const vm = require('node:vm');
const Module = require('node:module');
const { Writable } = require('node:stream');
const { StringDecoder } = require('node:string_decoder');
const { setImmediate: nextLoopTurn } = require('node:timers');

// User cells run in this realm and may overwrite globals (`const JSON = …` becomes a global var), so
// the driver keeps its own references to everything it needs from the global object.
const proc = process;
const { stringify: jsonStringify, parse: jsonParse } = JSON;
const { isArray } = Array;
const { getPrototypeOf, defineProperty, keys: objectKeys, entries: objectEntries, assign } = Object;
const ObjectProto = Object.prototype;
const BufferCtor = Buffer;
const PromiseCtor = Promise;
const globalObject = globalThis;
const realExit = process.exit.bind(process);

const REQUEST_FD = 3;
const EVENT_FD = 4;
const STREAM_CHUNK = 1 << 20;          // split stream text into events of at most ~1 Mi chars
const MAX_JSON_RESULT = 8 << 20;       // skip application/json larger than this (text/plain remains)
const MAX_EVENT_BYTES = 32 << 20;      // the agent gives up on a driver whose event line exceeds 64 MiB
const TRUNCATED_TEXT = 1 << 20;        // what is kept of an oversized result's text/plain
const LANGUAGES = new Set(['javascript', 'typescript']);

const state = {
  language: 'javascript',
  executionCount: 0,
  currentId: null,       // id stamped on events: the running execute, else the last one
  interrupt: null,       // rejects the running await cell's interrupt race (set while it waits)
  lastAutoResult: undefined,
};

// ---------------------------------------------------------------------------------------------------
// Events (fd 4)

function sleepMs(ms) {
  Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, ms);
}

function truncate(text, max) {
  return text.length > max ? `${text.slice(0, max)}…` : text;
}

/** A smaller stand-in for an event over MAX_EVENT_BYTES (a giant string result, a huge image). */
function shrinkEvent(event, bytes) {
  const note = `[${event.type} of ${(bytes / 1048576).toFixed(1)} MiB exceeds the ` +
    `${MAX_EVENT_BYTES >> 20} MiB event limit and was truncated]`;
  if (event.data) {
    const plain = String(event.data['text/plain'] ?? '');
    return { ...event, data: { 'text/plain': `${truncate(plain, TRUNCATED_TEXT)}\n${note}` } };
  }
  if (event.type === 'error') {
    const traceback = event.traceback.slice(0, 200).map((line) => truncate(String(line), 4096));
    const evalue = truncate(String(event.evalue), TRUNCATED_TEXT);
    return { ...event, evalue, traceback: [...traceback, note] };
  }
  return { type: 'stream', id: event.id, name: 'stderr', text: `${note}\n` };
}

/** Writes one event line synchronously; survives partial writes and a non-blocking fd. */
function send(event) {
  let buf = BufferCtor.from(jsonStringify(event) + '\n', 'utf8');
  if (buf.length > MAX_EVENT_BYTES) {
    buf = BufferCtor.from(jsonStringify(shrinkEvent(event, buf.length)) + '\n', 'utf8');
  }
  let off = 0;
  while (off < buf.length) {
    try {
      off += fs.writeSync(EVENT_FD, buf, off, buf.length - off);
    } catch (err) {
      if (err.code === 'EAGAIN') { sleepMs(1); continue; }
      // EPIPE/EBADF: nobody can ever read our events again, so the context is useless.
      realExit(err.code === 'EPIPE' ? 0 : 70);
    }
  }
}

function emitStream(name, text) {
  for (let i = 0; i < text.length;) {
    let end = Math.min(i + STREAM_CHUNK, text.length);
    // Do not cut a surrogate pair in half: each half would become U+FFFD on the other side.
    const code = text.charCodeAt(end - 1);
    if (end < text.length && code >= 0xd800 && code <= 0xdbff) end -= 1;
    send({ type: 'stream', id: state.currentId, name, text: text.slice(i, end) });
    i = end;
  }
}

// ---------------------------------------------------------------------------------------------------
// process.stdout / process.stderr → stream events

/**
 * A real Writable (libraries call .on/.once/.cork/.writableLength on stdout) whose writes become stream
 * events synchronously. `fd` stays 1/2 so `stdio: [0, process.stdout, process.stderr]` in child_process
 * still hands the real pipes to children.
 */
function makeOutputStream(name, fd) {
  const decoder = new StringDecoder('utf8');
  const stream = new Writable({
    decodeStrings: false,
    write(chunk, encoding, callback) {
      let text;
      if (typeof chunk === 'string' && (encoding === 'utf8' || encoding === 'utf-8' || !encoding)) {
        text = chunk;
      } else {
        text = decoder.write(typeof chunk === 'string' ? BufferCtor.from(chunk, encoding) : chunk);
      }
      if (text) emitStream(name, text);
      callback();
    },
  });
  stream.fd = fd;
  stream.isTTY = false;
  stream._isStdio = true;
  // Like Node's own stdio streams, these can never be closed: a cell calling process.stdout.end()
  // must not silence every later console.log of the context.
  stream.end = function end(chunk, encoding, callback) {
    if (typeof chunk === 'function') { callback = chunk; chunk = null; }
    if (typeof encoding === 'function') { callback = encoding; encoding = undefined; }
    if (chunk != null) this.write(chunk, encoding);
    if (typeof callback === 'function') proc.nextTick(callback);
    return this;
  };
  stream.destroy = function destroy() { return this; };
  return stream;
}

/** Must run before anything touches process.stdout/stderr (console included: it binds them lazily). */
function captureStdio() {
  for (const [name, fd] of [['stdout', 1], ['stderr', 2]]) {
    defineProperty(proc, name, {
      configurable: true, enumerable: true, writable: true, value: makeOutputStream(name, fd),
    });
  }
}

// ---------------------------------------------------------------------------------------------------
// Rich output (ijavascript conventions)

const METHOD_MIMES = [
  ['_toHtml', 'text/html', false],
  ['_toSvg', 'image/svg+xml', false],
  ['_toPng', 'image/png', true],
  ['_toJpeg', 'image/jpeg', true],
];

function safeInspect(value) {
  try { return util.inspect(value); } catch {
    try { return String(value); } catch { return '[uninspectable value]'; }
  }
}

/** JSON value of `value`, or undefined when it is not serialisable (cycles, BigInt, throwing getters). */
function jsonValue(value, limit = Infinity) {
  try {
    const text = jsonStringify(value);
    if (text === undefined || text.length > limit) return undefined;
    return jsonParse(text);
  } catch { return undefined; }
}

function isBinary(value) {
  return BufferCtor.isBuffer(value) || value instanceof Uint8Array || value instanceof ArrayBuffer;
}

function base64(value) {
  if (typeof value === 'string') return value;
  return BufferCtor.from(value instanceof ArrayBuffer ? new Uint8Array(value) : value).toString('base64');
}

function isPlainData(value) {
  if (isArray(value)) return true;
  const proto = getPrototypeOf(value);
  return proto === ObjectProto || proto === null;
}

/** Calls value[method]() and reports (instead of propagating) a failure: the value itself is fine. */
function callMimeMethod(value, method) {
  try {
    return typeof value[method] === 'function' ? value[method]() : undefined;
  } catch (err) {
    emitStream('stderr', `${method}() failed: ${safeInspect(err)}\n`);
    return undefined;
  }
}

function mimeBundle(value) {
  const data = { 'text/plain': safeInspect(value) };
  if (value === null || (typeof value !== 'object' && typeof value !== 'function')) return data;
  if (isPlainData(value)) {
    const json = jsonValue(value, MAX_JSON_RESULT);
    if (json !== undefined) data['application/json'] = json;
  }
  for (const [method, mime, binary] of METHOD_MIMES) {
    const out = callMimeMethod(value, method);
    if (out != null) data[mime] = binary ? base64(out) : String(out);
  }
  const custom = callMimeMethod(value, '_toMime');
  if (custom && typeof custom === 'object') {
    for (const mime of objectKeys(custom)) {
      const out = isBinary(custom[mime]) ? base64(custom[mime]) : jsonValue(custom[mime]);
      if (out !== undefined) data[mime] = out;
    }
  }
  return data;
}

function mimeValue(value, mime) {
  if (typeof value === 'string') return value;
  if (isBinary(value)) return base64(value);
  if (/json$/i.test(mime)) return jsonValue(value) ?? null;
  return String(value);
}

/** Global display(value[, mime]): a display_data event now, attributed to the current request. */
function display(value, mime) {
  const data = mime === undefined ? mimeBundle(value) : { [String(mime)]: mimeValue(value, String(mime)) };
  send({ type: 'display_data', id: state.currentId, data, metadata: {} });
}

// ---------------------------------------------------------------------------------------------------
// Errors

class InterruptError extends Error {
  constructor() { super('Script execution was interrupted by SIGINT'); this.name = 'InterruptError'; }
}

class ProcessExit extends Error {
  constructor(code) {
    super(`process.exit(${code === undefined ? '' : code}) was called; a code context cannot exit, ` +
      'its state is kept (restart or delete the context instead)');
    this.name = 'ProcessExit';
    this.code = code;
  }
}

/** A SyntaxError found by acorn or sucrase, with a V8-like "file:line / source / caret" header. */
class CellSyntaxError extends SyntaxError {
  constructor(message, source, filename, loc) {
    super(message);
    const line = (loc && loc.line) || 1;
    const column = Math.max(0, (loc && loc.column) || 0);
    const text = source.split('\n')[line - 1] || '';
    this.traceback = [`${filename}:${line}`, text, ' '.repeat(column) + '^', '', `SyntaxError: ${message}`];
  }
}

const VM_FRAME = /\((?:node:vm|node:internal\/vm)|^\s*at (?:node:vm|node:internal\/vm)/;
const NODE_INTERNAL_FRAME = /^\s*at (?:.*\()?node:internal\//;

function isDriverFrame(line) {
  return line.includes(__filename) || VM_FRAME.test(line);
}

/**
 * runInThisContext (displayErrors) prefixes the stack with "file:line / source / caret / blank" for
 * the throw site. That is useful for the cell's own code, noise when the throw site is inside Node.
 */
function dropInternalArrow(lines) {
  const arrow = lines.length > 3 && /^node:.*:\d+$/.test(lines[0]) && /^\s*\^+\s*$/.test(lines[2]) &&
    lines[3] === '';
  return arrow ? lines.slice(4) : lines;
}

/**
 * Lines of err.stack up to (excluding) the first frame of the driver or node:vm — everything below is
 * the driver's request loop — minus Node-internal frames (node:internal/…) that users cannot act on.
 */
function cleanTraceback(err) {
  if (isArray(err.traceback)) return err.traceback;
  const stack = typeof err.stack === 'string' ? err.stack : `${err.name}: ${err.message}`;
  const out = [];
  for (const line of dropInternalArrow(stack.split('\n'))) {
    if (isDriverFrame(line)) break;
    if (!NODE_INTERNAL_FRAME.test(line)) out.push(line);
  }
  return out;
}

function isErrorLike(value) {
  return value instanceof Error || util.types.isNativeError(value);
}

function errorEvent(id, thrown) {
  if (!isErrorLike(thrown)) {
    let evalue;
    try { evalue = String(thrown); } catch { evalue = safeInspect(thrown); }
    return { type: 'error', id, ename: 'Error', evalue, traceback: [`Uncaught ${safeInspect(thrown)}`] };
  }
  let ename = 'Error';
  let evalue = '';
  try { ename = String(thrown.name); evalue = String(thrown.message); } catch { /* exotic error */ }
  let traceback;
  try { traceback = cleanTraceback(thrown); } catch { traceback = [`${ename}: ${evalue}`]; }
  return { type: 'error', id, ename, evalue, traceback };
}

/** Errors raised outside any cell (timers, un-awaited rejections) can only be reported as stderr. */
function reportBackgroundError(prefix, thrown) {
  let text;
  try { text = isErrorLike(thrown) ? cleanTraceback(thrown).join('\n') : safeInspect(thrown); } catch {
    text = safeInspect(thrown);
  }
  emitStream('stderr', `${prefix} ${text}\n`);
}

// ---------------------------------------------------------------------------------------------------
// Cell compilation: TypeScript / imports (sucrase) → declaration hoisting (acorn) → vm.Script

// Both are loaded on first use (acorn ~10 ms, sucrase 30-80 ms) and warmed up right after "ready".
let acornModule = null;
let sucraseModule = null;
const acorn = () => (acornModule ??= require('acorn'));
const sucrase = () => (sucraseModule ??= require('sucrase'));

const SCRIPT_OPTIONS = {
  ecmaVersion: 'latest', sourceType: 'script', allowAwaitOutsideFunction: true, allowHashBang: true,
};
const MODULE_OPTIONS = { ecmaVersion: 'latest', sourceType: 'module', allowHashBang: true };
const IMPORT_EXPORT_ERROR = /'import' and 'export' may appear only with 'sourceType: module'/;
const FUNCTION_NODES = new Set(['FunctionDeclaration', 'FunctionExpression', 'ArrowFunctionExpression']);

function sucraseTransform(code, filename, options) {
  try {
    return sucrase().transform(code, { disableESTransforms: true, ...options }).code;
  } catch (err) {
    if (!(err instanceof SyntaxError)) throw err;
    const loc = err.loc && { line: err.loc.line, column: err.loc.column - 1 };  // sucrase: 1-based
    throw new CellSyntaxError(stripPosition(err.message), code, filename, loc);
  }
}

function stripPosition(message) {
  return message.replace(/ \(\d+:\d+\)$/, '');
}

// sucrase drops value namespaces without a word (alangpierce/sucrase#659); say so instead.
const NAMESPACE_DECLARATION =
  /^[ \t]*(?:export[ \t]+)?(?:namespace|module)[ \t]+([A-Za-z_$][\w$.]*)[ \t]*\{/m;

/** TypeScript → JavaScript. Unused imports are kept: in a REPL they are usually meant for later cells. */
function typescriptToJs(code, filename) {
  const js = sucraseTransform(code, filename, { transforms: ['typescript'], keepUnusedImports: true });
  const namespace = NAMESPACE_DECLARATION.exec(code);
  if (namespace) {
    emitStream('stderr', `warning: namespace ${namespace[1]} is not emitted (the TypeScript transform, ` +
      'sucrase, only supports type-only namespaces); use an object or a const enum instead\n');
  }
  return js;
}

/**
 * Static import/export → require/exports. sucrase rewrites every use of an imported name into a
 * member access (`os` → `_os2.default`), so the names would not exist for the next cell; a statement
 * `void Object.assign(globalThis, {os, join})` after each import (rewritten the same way) publishes them.
 */
function importsToCommonJs(js, filename) {
  let withAliases = js;
  try {
    const ast = acorn().parse(js, MODULE_OPTIONS);
    const imports = ast.body.filter((n) => n.type === 'ImportDeclaration' && n.specifiers.length);
    for (const decl of imports.reverse()) {
      const names = decl.specifiers.map((s) => s.local.name).join(', ');
      withAliases = `${withAliases.slice(0, decl.end)};void Object.assign(globalThis, {${names}});` +
        withAliases.slice(decl.end);
    }
  } catch { /* not parseable as a module (sloppy-only syntax): imports still work within the cell */ }
  const out = sucraseTransform(withAliases, filename, {
    transforms: ['imports'], preserveDynamicImport: true, keepUnusedImports: true,
  });
  // sucrase prepends "use strict" (ES modules are strict); the rest of the cell was written as a script.
  return out.startsWith('"use strict";') ? out.slice('"use strict";'.length) : out;
}

/** Visits every node of `node`'s subtree that runs in the top-level scope (not inside functions). */
function walkTopScope(node, visit, parent = null, key = null) {
  for (const field of objectKeys(node)) {
    const child = node[field];
    const list = isArray(child) ? child : [child];
    for (const item of list) {
      if (!item || typeof item.type !== 'string') continue;
      if (FUNCTION_NODES.has(item.type) || item.type === 'StaticBlock') continue;
      if (visit(item, node, field) !== false) walkTopScope(item, visit, node, field);
    }
  }
}

function hasTopLevelAwait(ast) {
  let found = false;
  walkTopScope(ast, (node) => {
    if (node.type === 'AwaitExpression' || (node.type === 'ForOfStatement' && node.await)) found = true;
    return !found;
  });
  return found;
}

function bindingNames(pattern, into) {
  switch (pattern.type) {
    case 'Identifier': into.add(pattern.name); break;
    case 'ObjectPattern':
      for (const prop of pattern.properties) {
        bindingNames(prop.type === 'RestElement' ? prop : prop.value, into);
      }
      break;
    case 'ArrayPattern': for (const el of pattern.elements) if (el) bindingNames(el, into); break;
    case 'AssignmentPattern': bindingNames(pattern.left, into); break;
    case 'RestElement': bindingNames(pattern.argument, into); break;
    default: break;
  }
}

/**
 * Source edits for one declaration → assignment. Edits are minimal (blank out the keyword, parenthesise
 * each declarator) so line and column numbers stay close to what the user wrote.
 *   statement in a list:   `const {a} = o, b = 1`  →  `;     ({a} = o), (b = 1);`  (';' guards ASI)
 *   sole statement:        `if (c) var x = 1`      →  `if (c) {   (x = 1);}`
 *   for-init:              `for (var i = 0; …)`    →  `for (    (i = 0); …)`
 *   for-in/of head:        `for (var k in o)`      →  `for (    k in o)`
 */
function declarationEdits(js, decl, parent, key, hoisted, edits) {
  for (const d of decl.declarations) bindingNames(d.id, hoisted);
  const keywordEnd = decl.start + decl.kind.length;
  const blankKeyword = (lead) => [decl.start, keywordEnd, lead.padEnd(decl.kind.length)];
  const forHead = (parent.type === 'ForInStatement' || parent.type === 'ForOfStatement') && key === 'left';
  if (forHead) { edits.push(blankKeyword('')); return; }
  const inList = isArray(parent[key]);
  const isStatement = !(parent.type === 'ForStatement' && key === 'init');
  edits.push(blankKeyword(isStatement ? (inList ? ';' : '{') : ''));
  for (const d of decl.declarations) {
    edits.push([d.start, d.start, '(']);
    edits.push([d.end, d.end, d.init ? ')' : decl.kind === 'var' ? ')' : ' = void 0)']);
  }
  if (isStatement) {
    const terminated = js[decl.end - 1] === ';';
    edits.push([decl.end, decl.end, (terminated ? '' : ';') + (inList ? '' : '}')]);
  }
}

function applyEdits(source, edits) {
  edits.sort((a, b) => a[0] - b[0] || a[1] - b[1]);  // stable: same-position inserts keep their order
  let out = '';
  let cursor = 0;
  for (const [start, end, text] of edits) {
    out += source.slice(cursor, start) + text;
    cursor = end;
  }
  return out + source.slice(cursor);
}

const isDeclaration = (node) => /^(Variable|Function|Class)Declaration$/.test(node.type);

/**
 * Rewrites a parsed script so that it can be re-run and keeps its top-level bindings as globals.
 * Sync cells: let/const/class → assignments + a trailing `var` list (var and function declarations are
 * already re-declarable globals in a script); the script's completion value is the result.
 * Await cells: also var/function (they would be locals of the wrapper), wrapped in
 * `(async () => {…})()` with the last expression statement turned into `return (…)`.
 */
function rewriteCell(js, ast) {
  const isAsync = hasTopLevelAwait(ast);
  const edits = [];
  const hoisted = new Set();
  const functions = [];
  for (const stmt of ast.body) {
    if (stmt.type === 'VariableDeclaration' && stmt.kind !== 'var') {
      declarationEdits(js, stmt, ast, 'body', hoisted, edits);
    } else if (stmt.type === 'ClassDeclaration') {
      hoisted.add(stmt.id.name);
      edits.push([stmt.start, stmt.start, `;${stmt.id.name} = `], [stmt.end, stmt.end, ';']);
    } else if (stmt.type === 'FunctionDeclaration' && isAsync) {
      hoisted.add(stmt.id.name);
      functions.push(stmt.id.name);
    }
  }
  const last = ast.body[ast.body.length - 1];
  const endsInDeclaration = last !== undefined && isDeclaration(last);
  const varList = () => (hoisted.size ? `\n;var ${[...hoisted].join(', ')};` : '');
  if (!isAsync) {
    return { code: applyEdits(js, edits) + (endsInDeclaration ? '\n;void 0' : '') + varList(), isAsync };
  }
  walkTopScope(ast, (node, parent, key) => {
    if (node.type !== 'VariableDeclaration' || node.kind !== 'var') return true;
    declarationEdits(js, node, parent, key, hoisted, edits);
    return true;
  });
  // Function declarations are hoisted inside the wrapper; publish them as globals before anything runs
  // (after the directive prologue, so a leading "use strict" keeps its meaning).
  if (functions.length) {
    const first = ast.body.find((n) => !n.directive);
    const publish = functions.map((name) => `this.${name} = ${name};`).join(' ');
    edits.push([first.start, first.start, `;${publish}`]);
  }
  if (last && last.type === 'ExpressionStatement') {
    edits.push([last.expression.start, last.expression.start, 'return ('],
      [last.expression.end, last.expression.end, ')']);
  }
  return { code: `(async () => {\n${applyEdits(js, edits)}\n})()${varList()}`, isAsync };
}

function parseScript(js) {
  return acorn().parse(js, SCRIPT_OPTIONS);
}

/** `{a: 1}` alone is a block with a label; like Node's REPL, prefer reading it as an object literal. */
function objectLiteralCell(code, filename) {
  if (!/^\s*\{/.test(code) || !/\}\s*$/.test(code)) return null;
  try {
    const wrapped = toJs(`(${code}\n)`, filename);
    return { js: wrapped, ast: parseScript(wrapped) };
  } catch { return null; }
}

function toJs(code, filename) {
  return state.language === 'typescript' ? typescriptToJs(code, filename) : code;
}

/**
 * acorn rejected `js`. If V8 accepts it as a plain script (syntax acorn does not know), run it without
 * the rewrite; otherwise report V8's message, which Node users recognise, unless V8 only complains
 * about top-level await/import (then acorn's message points at the real problem).
 */
function handleParseFailure(js, acornError, filename) {
  try {
    new vm.Script(js, { filename });
    return { code: js, isAsync: false };
  } catch (v8Error) {
    if (!(v8Error instanceof SyntaxError) || /await is only valid|import statement/.test(v8Error.message)) {
      throw new CellSyntaxError(stripPosition(acornError.message), js, filename, acornError.loc);
    }
    throw v8Error;
  }
}

function compileCell(code, filename) {
  const literal = objectLiteralCell(code, filename);
  if (literal) return rewriteCell(literal.js, literal.ast);
  let js = toJs(code, filename);
  let ast;
  try {
    ast = parseScript(js);
  } catch (err) {
    if (!IMPORT_EXPORT_ERROR.test(err.message)) return handleParseFailure(js, err, filename);
    js = importsToCommonJs(js, filename);
    try { ast = parseScript(js); } catch (err2) { return handleParseFailure(js, err2, filename); }
  }
  return rewriteCell(js, ast);
}

// ---------------------------------------------------------------------------------------------------
// Execution

// Makes `import()` inside cells use Node's normal ESM loader (relative to the context cwd).
const importModuleDynamically = vm.constants && vm.constants.USE_MAIN_CONTEXT_DEFAULT_LOADER;

/** Resolves/rejects with `promise`, or rejects with InterruptError when SIGINT arrives first. */
function untilSettledOrInterrupted(promise) {
  return new PromiseCtor((resolve, reject) => {
    state.interrupt = () => reject(new InterruptError());
    promise.then(resolve, reject);
  }).finally(() => { state.interrupt = null; });
}

function isInterrupt(err) {
  return err instanceof InterruptError || (err && err.code === 'ERR_SCRIPT_EXECUTION_INTERRUPTED');
}

/** Like Node's REPL: `_` holds the last result until the user assigns `_` themselves. */
function rememberResult(value) {
  if (!('_' in globalObject) || globalObject._ === state.lastAutoResult) {
    globalObject._ = state.lastAutoResult = value;
  }
}

/** Whether `value` is a promise or another thenable (a throwing `then` getter counts as not). */
function isThenable(value) {
  if (util.types.isPromise(value)) return true;
  if (value === null || (typeof value !== 'object' && typeof value !== 'function')) return false;
  try { return typeof value.then === 'function'; } catch { return false; }
}

/**
 * Runs one cell and resolves to `{ value }`: the cell's value, awaited (interruptibly) when it is a
 * thenable — an await cell's wrapper promise, or a promise the cell ends with.
 */
async function evaluate(code, filename) {
  const cell = compileCell(code, filename);
  const script = new vm.Script(cell.code, {
    filename, lineOffset: cell.isAsync ? -1 : 0, importModuleDynamically,
  });
  const value = script.runInThisContext({ breakOnSigint: true });
  return { value: cell.isAsync || isThenable(value) ? await untilSettledOrInterrupted(value) : value };
}

async function handleExecute(req) {
  const count = ++state.executionCount;
  let status = 'ok';
  try {
    const { value } = await evaluate(String(req.code ?? ''), `<cell-${count}>`);
    if (value !== undefined) {
      rememberResult(value);
      const data = mimeBundle(value);
      send({ type: 'execute_result', id: req.id, execution_count: count, data, metadata: {} });
    }
  } catch (err) {
    status = 'error';
    send(errorEvent(req.id, isInterrupt(err) ? new InterruptError() : err));
  }
  // Node reports a promise the cell rejected without handling only after the microtask queue drains;
  // one loop turn lets that stderr report land inside this cell rather than in the next one.
  await new PromiseCtor((resolve) => nextLoopTurn(resolve));
  send({ type: 'done', id: req.id, status, execution_count: count });
}

// ---------------------------------------------------------------------------------------------------
// Context: cwd, env, require

/** require/module/exports/__filename/__dirname for cells, resolving relative to `cwd`. */
function bindModuleGlobals(cwd) {
  const filename = path.join(cwd, '<cell>');
  const mod = new Module(filename, null);
  mod.filename = filename;
  mod.paths = typeof Module._nodeModulePaths === 'function' ? Module._nodeModulePaths(cwd) : [];
  mod.loaded = true;
  assign(globalObject, {
    require: Module.createRequire(filename), module: mod, exports: mod.exports,
    __filename: filename, __dirname: cwd,
  });
}

function handleInit(req) {
  try {
    if (req.language != null) {
      if (!LANGUAGES.has(req.language)) throw new TypeError(`unknown language ${jsonStringify(req.language)}`);
      state.language = req.language;
      warmUp();
    }
    if (req.cwd != null) proc.chdir(String(req.cwd));
    for (const [name, value] of objectEntries(req.env || {})) {
      if (value === null) delete proc.env[name]; else proc.env[name] = String(value);
    }
    bindModuleGlobals(proc.cwd());
    send({ type: 'done', id: req.id, status: 'ok' });
  } catch (err) {
    send(errorEvent(req.id, err));
    send({ type: 'done', id: req.id, status: 'error' });
  }
}

// ---------------------------------------------------------------------------------------------------
// Requests (fd 3)

const requests = { queue: [], busy: false, eof: false };

function protocolError(id, message) {
  const traceback = [`ProtocolError: ${message}`];
  send({ type: 'error', id, ename: 'ProtocolError', evalue: message, traceback });
  send({ type: 'done', id, status: 'error' });
}

async function handleLine(line) {
  let req;
  try {
    req = jsonParse(line);
  } catch (err) {
    protocolError(null, `invalid JSON request: ${err.message}`);
    return;
  }
  if (!req || typeof req !== 'object') { protocolError(null, 'request is not a JSON object'); return; }
  const id = req.id ?? null;
  if (req.type === 'execute') {
    state.currentId = id;   // also stamps later background output, until the next execute
    await handleExecute({ ...req, id });
  } else if (req.type === 'init') {
    handleInit({ ...req, id });
  } else {
    protocolError(id, `unknown request type ${jsonStringify(req.type)}`);
  }
}

async function pump() {
  if (requests.busy) return;
  requests.busy = true;
  while (requests.queue.length) {
    try { await handleLine(requests.queue.shift()); } catch (err) {
      reportBackgroundError('driver error:', err);   // a driver bug must not stop the request loop
    }
  }
  requests.busy = false;
  if (requests.eof) realExit(0);
}

function openRequestStream() {
  try {
    // Pipes and sockets: a libuv handle (no thread-pool thread parked in a blocking read).
    return new net.Socket({ fd: REQUEST_FD, readable: true, writable: false });
  } catch {
    return fs.createReadStream(null, { fd: REQUEST_FD, autoClose: false });   // e.g. a regular file
  }
}

function startRequestReader() {
  const input = openRequestStream();
  input.setEncoding('utf8');
  let pending = '';
  const enqueue = (line) => { if (line.trim()) requests.queue.push(line); };
  input.on('data', (chunk) => {
    let start = 0;
    let nl = chunk.indexOf('\n');
    while (nl !== -1) {
      enqueue(pending + chunk.slice(start, nl));
      pending = '';
      start = nl + 1;
      nl = chunk.indexOf('\n', start);
    }
    pending += chunk.slice(start);
    pump();
  });
  const finish = () => {
    if (requests.eof) return;
    enqueue(pending);
    requests.eof = true;
    pump();
  };
  input.on('end', finish);
  input.on('error', finish);   // an unreadable request channel is the end of the conversation too
}

// ---------------------------------------------------------------------------------------------------
// Process guards

function installGuards() {
  // Without a listener SIGINT kills the process; with it, an idle SIGINT is ignored and a cell
  // waiting on a promise is interrupted. (breakOnSigint handles SIGINT during synchronous code.)
  proc.on('SIGINT', () => { if (state.interrupt) state.interrupt(); });
  proc.on('uncaughtException', (err) => reportBackgroundError('Uncaught', err));
  proc.on('unhandledRejection', (reason) => reportBackgroundError('Uncaught (in promise)', reason));
  // Exiting would drop the context's state mid-request; report it as the cell's error instead.
  proc.exit = function exit(code) { throw new ProcessExit(code); };
}

function installCellGlobals() {
  globalObject.display = display;
  bindModuleGlobals(proc.cwd());
  proc.argv = [proc.argv[0]];   // like the REPL: user code should not see the driver's arguments
}

function warmUp() {
  try {
    parseScript('let warm = 1');
    if (state.language === 'typescript') typescriptToJs('let warm: number = 1', '<warm-up>');
  } catch { /* loaded again (and reported) on first real use */ }
}

function main() {
  const language = proc.argv[2] || 'javascript';
  if (!LANGUAGES.has(language)) {
    fs.writeSync(2, `usage: node driver.js javascript|typescript (got ${jsonStringify(language)})\n`);
    realExit(2);
  }
  state.language = language;
  captureStdio();
  installGuards();
  installCellGlobals();
  startRequestReader();
  send({ type: 'ready', pid: proc.pid, language, mode: 'node', version: proc.version });
  setImmediate(warmUp);
}

main();
