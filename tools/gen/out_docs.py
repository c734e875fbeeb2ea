"""tools/gen/out_docs.py — the operation tables of docs/protocol.md.

emit(schema) rewrites what stands between marker comments in
docs/protocol.md and leaves the prose around them as it is:

  <!-- BEGIN GENERATED ops --> … <!-- END GENERATED ops -->
      every operation: where it runs, whether it creates the sandbox,
      changes durable state, is idempotent, its REST routes, its summary
  <!-- BEGIN GENERATED op-fields --> … <!-- END GENERATED op-fields -->
      per op family, a table of the arguments (type, unit, default, bounds)
      and one of the results

A marker pair that is missing is an error (the generated text has nowhere
to go).
"""
import os
import re

from gen import schema as S

PATH = 'docs/protocol.md'
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FAMILY_TITLE = {'exec': 'Commands', 'stream': 'Streams', 'session': 'Sessions',
                'process': 'Background processes', 'file': 'Files', 'git': 'git',
                'context': 'Code interpreter', 'terminal': 'Terminals', 'port': 'Preview URLs',
                'preview': 'Preview URLs', 'env': 'Sandbox', 'sandbox': 'Sandbox',
                'cluster': 'Deployment', 'image': 'Images'}


def family(op):
    n = op['name']
    if 'global' in op['flags']:
        return 'cluster'
    if '.' not in n:
        return 'exec' if n == 'exec' else 'sandbox'
    return n.split('.')[0]


def doc_type(f, types):
    t = f['type']
    if isinstance(t, list):
        return ' or '.join(doc_type(dict(f, type=x), types) if x == 'array' else
                           {'integer': 'int', 'number': 'num', 'boolean': 'bool',
                            'string': 'str', 'object': 'map', 'null': 'nil'}[x] for x in t)
    if t in types:
        return t
    if t == 'enum':
        return ' | '.join(f'`{v}`' for v in f['enum'])
    if t == 'array':
        return f"[{doc_type(f['items'], types)}]"
    if t == 'map':
        return f"{{str: {doc_type(f['values'], types)}}}"
    if t == 'object':
        keys = list((f.get('fields') or {}).keys())
        if not keys:
            return 'map'
        return '{' + ', '.join(keys[:8]) + (', …' if len(keys) > 8 else '') + '}'
    return {'string': 'str', 'integer': 'int', 'number': 'num', 'boolean': 'bool',
            'bytes': 'bin or str', 'any': 'any'}[t]


def bounds(f):
    b = []
    if 'min' in f and 'max' in f:
        b.append(f"{f['min']} … {f['max']}")
    elif 'min' in f:
        b.append(f"≥ {f['min']}")
    elif 'max' in f:
        b.append(f"≤ {f['max']}")
    if f.get('max_len') is not None:
        what = {'array': 'items', 'map': 'entries'}.get(f['type'] if isinstance(f['type'], str)
                                                       else '', 'bytes')
        b.append(f"≤ {f['max_len']} {what}")
    if f.get('enum') and f['type'] != 'enum':
        b.append(', '.join(f'`{v}`' for v in f['enum']))
    return '; '.join(b)


def cell(s):
    return str(s).replace('|', '\\|').replace('\n', ' ')


def default(f):
    if 'default' not in f:
        return ''
    d = f['default']
    if isinstance(d, bool):
        d = 'true' if d else 'false'
    return f'`{d}`'


def overview(sch):
    rows = ['| op | runs in | creates | mutates | activity | idempotent | REST routes | summary |',
            '|---|---|---|---|---|---|---|---|']
    for op in sch['ops']:
        if 'internal' in op['flags'] or 'front' in op['flags']:
            continue
        fl = op['flags']
        creates = '—' if 'global' in fl or 'node' in fl else ('no' if 'nocreate' in fl else 'yes')
        routes = [op['rest']['canonical']] + op['rest']['aliases']
        rows.append(f"| `{op['name']}` | {op['layer']} | {creates} | "
                    f"{'yes' if 'mutates' in fl else ''} | {'no' if 'observe' in fl else ''} | "
                    f"{'yes' if op['idempotent'] else 'no'} | "
                    + '<br>'.join(f'`{cell(r)}`' for r in routes)
                    + f" | {cell(op['summary'])}{' (stream)' if 'stream' in fl else ''} |")
    return '\n'.join(rows)


def fields_tables(sch):
    types = sch['types']
    fams, order = {}, []
    for op in sch['ops']:
        if 'internal' in op['flags'] or 'front' in op['flags']:
            continue
        fam = family(op)
        if fam not in fams:
            fams[fam] = []
            order.append(fam)
        fams[fam].append(op)
    out = []
    for fam in order:
        ops = fams[fam]
        title = FAMILY_TITLE.get(fam, fam)
        out.append(f"**{title}** ({', '.join('`' + o['name'] + '`' for o in ops)})\n")
        arows = ['| op | argument | type | unit | default | bounds | meaning |',
                 '|---|---|---|---|---|---|---|']
        rrows = ['| op | result field | type | unit | meaning |', '|---|---|---|---|---|']
        for op in ops:
            for k, f in op['args'].items():
                arows.append(f"| `{op['name']}` | `{k}`{' (required)' if f['required'] else ''} | "
                             f"{cell(doc_type(f, types))} | {f.get('unit', '')} | {default(f)} | "
                             f"{cell(bounds(f))} | {cell(f['doc'])} |")
            r = op['result']
            if r is None:
                continue
            if r['type'] in types and not r.get('fields'):
                rt = types[r['type']]
                res_fields = rt.get('fields') or {}
                if not res_fields:
                    rrows.append(f"| `{op['name']}` | | {cell(r['type'])} | | {cell(r['doc'])} |")
            else:
                res_fields = r.get('fields') or {}
                if not res_fields:
                    rrows.append(f"| `{op['name']}` | | {cell(doc_type(r, types))} | | "
                                 f"{cell(r['doc'])} |")
            for k, f in res_fields.items():
                rrows.append(f"| `{op['name']}` | `{k}`{'' if f['required'] else '?'} | "
                             f"{cell(doc_type(f, types))} | {f.get('unit', '')} | "
                             f"{cell(f['doc'])} |")
        if len(arows) > 2:
            out.append('\n'.join(arows) + '\n')
        if len(rrows) > 2:
            out.append('\n'.join(rrows) + '\n')
    if types:
        out.append('**Shared types**\n')
        rows = ['| type | field | type | unit | meaning |', '|---|---|---|---|---|']
        for name, f in types.items():
            fs = f.get('fields') or {}
            if not fs:
                rows.append(f"| `{name}` | | {cell(doc_type(f, types))} | | {cell(f['doc'])} |")
            for k, v in fs.items():
                rows.append(f"| `{name}` | `{k}`{'' if v['required'] else '?'} | "
                            f"{cell(doc_type(v, types))} | {v.get('unit', '')} | {cell(v['doc'])} |")
        out.append('\n'.join(rows) + '\n')
    return '\n'.join(out).rstrip('\n')


def replace_block(text, name, body):
    begin, end = f'<!-- BEGIN GENERATED {name} -->', f'<!-- END GENERATED {name} -->'
    pat = re.compile(re.escape(begin) + r'.*?' + re.escape(end), re.S)
    if not pat.search(text):
        raise S.SchemaError(f'{PATH}: no "{begin}" … "{end}" block')
    note = (f'{begin}\n<!-- {S.HEADER} (tools/gen/out_docs.py); the prose around it is '
            f'hand-written -->\n')
    return pat.sub(lambda m: f'{note}{body}\n{end}', text, count=1)


def emit(sch):
    with open(os.path.join(ROOT, PATH), encoding='utf-8') as f:
        text = f.read()
    text = replace_block(text, 'ops', overview(sch))
    text = replace_block(text, 'op-fields', fields_tables(sch))
    return {PATH: text}
