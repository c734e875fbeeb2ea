"""tools/gen/out_ts.py — the TypeScript shapes of every operation.

emit(schema) writes sdk/typescript/src/generated/ops.ts: for each op its
arguments (<Op>Args) and its result (<Op>Result, or the named type it is) as
they travel over HTTP/JSON, the reusable `types`, the error codes, and the map
`Ops` (op name -> {args, result}).  sdk/typescript/src/types.ts derives the
SDK's public types from these where the shapes are the same; the ergonomic
wrappers (sandbox.ts) stay hand-written.  Names follow out_openapi.py, so
`ExecArgs` here is `components.schemas.ExecArgs` of gateway/openapi.json.
"""
import re

from gen import schema as S
from gen.out_openapi import UNIT_TEXT, args_name, describe, result_name

PATH = 'sdk/typescript/src/generated/ops.ts'
JSON_TS = {'string': 'string', 'integer': 'number', 'number': 'number', 'boolean': 'boolean',
           'object': 'Record<string, unknown>', 'null': 'null'}
IDENT = re.compile(r'^[A-Za-z_$][A-Za-z0-9_$]*$')


def _key(k):
    return k if IDENT.match(k) else repr(k)


def _comment(text, ind):
    text = text.replace('*/', '*\\/')
    return f'{ind}/** {text} */\n'


def field_doc(f):
    d = describe(f)
    b = []
    if 'min' in f or 'max' in f:
        b.append(f"{f.get('min', '…')} … {f.get('max', '…')}")
    if 'default' in f:
        b.append(f"default {f['default']!r}".replace("'", '"') if isinstance(f['default'], str)
                 else f"default {str(f['default']).lower() if isinstance(f['default'], bool) else f['default']}")
    if b:
        d += ' [' + '; '.join(b) + ']'
    return d


def ts_type(f, types, ind=''):
    t = f['type']
    if isinstance(t, list):
        parts = []
        for x in t:
            if x == 'array':
                parts.append(_arr(ts_type(f['items'], types, ind)) if 'items' in f else 'unknown[]')
            else:
                parts.append(JSON_TS[x])
        return ' | '.join(parts)
    if t in types:
        return t
    if t in ('string', 'bytes'):
        if f.get('enum'):
            return ' | '.join("'" + str(v) + "'" for v in f['enum'])
        return 'string'
    if t in ('integer', 'number'):
        return 'number'
    if t == 'boolean':
        return 'boolean'
    if t == 'enum':
        return ' | '.join("'" + str(v) + "'" for v in f['enum'])
    if t == 'array':
        return _arr(ts_type(f['items'], types, ind))
    if t == 'map':
        return f"Record<string, {ts_type(f['values'], types, ind)}>"
    if t == 'any':
        return 'unknown'
    if t == 'object':
        return obj(f.get('fields') or {}, types, ind, f.get('additional'))
    raise S.SchemaError(f'ts: no TypeScript type for {t!r}')


def _arr(inner):
    return f'({inner})[]' if ('|' in inner or '&' in inner) and not inner.startswith('{') else f'{inner}[]'


def obj(fields, types, ind, additional):
    if not fields and additional:
        return 'Record<string, unknown>'
    if not fields:
        return 'Record<string, never>'
    inner = ind + '  '
    out = '{\n'
    for k, v in fields.items():
        out += _comment(field_doc(v), inner)
        out += f"{inner}{_key(k)}{'' if v['required'] else '?'}: {ts_type(v, types, inner)};\n"
    if additional:
        out += f'{inner}[key: string]: unknown;\n'
    return out + ind + '}'


def declare(name, f, types, doc):
    """`export interface` for an object, else `export type`."""
    out = _comment(doc, '')
    if f['type'] == 'object' and f.get('fields'):
        return out + f"export interface {name} {obj(f.get('fields') or {}, types, '', f.get('additional'))}\n"
    return out + f'export type {name} = {ts_type(f, types)};\n'


def emit(sch):
    types = sch['types']
    o = [S.header('//'),
         '/**\n'
         ' * The shapes of every operation as they travel over HTTP/JSON: arguments\n'
         ' * (`<Op>Args`), results (`<Op>Result`), shared types and error codes,\n'
         ' * generated from runtime/ops.yaml by tools/gen/out_ts.py (docs/schema.md).\n'
         ' * Units are in each field\'s comment: durations in milliseconds unless\n'
         ' * stated, sizes in bytes. Byte fields (`stdout`, …) are UTF-8 text, or\n'
         ' * base64 with `X-Sbx-Binary: base64`.\n'
         ' *\n'
         ' * @module\n'
         ' */\n\n']
    codes = sorted(sch['errors'])
    o.append('/** Stable error codes (runtime/err.h, docs/protocol.md §4). */\n')
    o.append('export type ErrorCode =\n' + ''.join(f"  | '{c}'\n" for c in codes)[:-1] + ';\n\n')
    o.append('/** The HTTP status of each error code. */\n')
    o.append('export const ERROR_HTTP_STATUS: Readonly<Record<ErrorCode, number>> = {\n'
             + ''.join(f'  {c}: {sch["errors"][c][1]},\n' for c in codes) + '};\n\n')
    o.append('/** The error object of a failed operation (docs/protocol.md §4). */\n'
             'export interface ErrorBody {\n'
             '  /** Stable code. */\n  code: ErrorCode;\n'
             '  /** What went wrong, for people. */\n  message: string;\n'
             '  /** sandboxId and operation where known, plus fields of the code. */\n'
             '  context: Record<string, unknown>;\n'
             '  /** The HTTP status (HTTP answers only). */\n  httpStatus?: number;\n}\n\n')
    if types:
        o.append('// ---------------------------------------------------------------------------\n'
                 '// Shared types\n\n')
        for name, f in types.items():
            o.append(declare(name, f, types, f['doc']) + '\n')
    o.append('// ---------------------------------------------------------------------------\n'
             '// Operations\n\n')
    table = []
    declared = set(types)
    for op in sch['ops']:
        if 'internal' in op['flags'] or 'front' in op['flags']:
            continue
        an, rn = args_name(op), result_name(op)
        for n in (an, rn):
            if n in declared and n not in types:
                raise S.SchemaError(f'ts: {n} is declared twice')
        flags = ', '.join(op['flags']) or 'none'
        o.append(declare(an, {'type': 'object', 'fields': op['args']}, types,
                         f"Arguments of `{op['name']}`: {op['summary']}. Runs in the "
                         f"{op['layer']}; flags: {flags}."))
        o.append('\n')
        declared.add(an)
        if rn not in types:
            r = op['result'] or {'type': 'object', 'doc': 'an empty map'}
            o.append(declare(rn, r, types, f"Result of `{op['name']}`: {r['doc']}"))
            o.append('\n')
            declared.add(rn)
        table.append((op['name'], an, rn))
    o.append('/** Every operation a client may call: its arguments and its result. */\n'
             'export interface Ops {\n'
             + ''.join(f"  '{n}': {{ args: {a}; result: {r} }};\n" for n, a, r in table)
             + '}\n\n/** The name of an operation. */\nexport type OpName = keyof Ops;\n')
    return {PATH: ''.join(o)}


__all__ = ['emit', 'ts_type', 'UNIT_TEXT']
