"""tools/gen/out_py.py — the Python shapes of every operation.

emit(schema) writes sdk/python/sbx_sandbox/_ops.py: TypedDicts of each op's
arguments (<Op>Args) and result (<Op>Result, or the named type it is) with
their JSON (camelCase) keys, the reusable `types`, the error codes with their
HTTP status, and OPS (op name -> (args, result)).  sbx_sandbox/models.py
builds its snake_case dataclasses from these dicts; names follow
out_openapi.py (gateway/openapi.json's components).  Python 3.8: no
typing.Required, so a shape with required keys is a total base class with an
optional-keys subclass.
"""
import keyword
import re

from gen import schema as S
from gen.out_openapi import args_name, result_name
from gen.out_ts import field_doc

PATH = 'sdk/python/sbx_sandbox/_ops.py'
JSON_PY = {'string': 'str', 'integer': 'int', 'number': 'float', 'boolean': 'bool',
           'object': 'Dict[str, Any]', 'null': 'None', 'array': 'List[Any]'}
IDENT = re.compile(r'^[A-Za-z_][A-Za-z0-9_]*$')


def py_type(f, types, nested, hint):
    """The annotation of a field; nested object shapes become TypedDicts of
    their own (appended to `nested`), named after `hint`."""
    t = f['type']
    if isinstance(t, list):
        parts = []
        for x in t:
            if x == 'array' and 'items' in f:
                parts.append(f"List[{py_type(f['items'], types, nested, hint + 'Item')}]")
            else:
                parts.append(JSON_PY[x])
        return 'Union[' + ', '.join(parts) + ']' if len(parts) > 1 else parts[0]
    if t in types:
        return f"'{t}'"
    if t in ('string', 'bytes'):
        return 'str'
    if t == 'integer':
        return 'int'
    if t == 'number':
        return 'float'
    if t == 'boolean':
        return 'bool'
    if t == 'enum':
        return 'str'
    if t == 'array':
        return f"List[{py_type(f['items'], types, nested, hint + 'Item')}]"
    if t == 'map':
        return f"Dict[str, {py_type(f['values'], types, nested, hint + 'Value')}]"
    if t == 'any':
        return 'Any'
    if t == 'object':
        if not f.get('fields'):
            return 'Dict[str, Any]'
        nested.append(typeddict(hint, f, types, nested))
        return f"'{hint}'"
    raise S.SchemaError(f'python: no type for {t!r}')


def typeddict(name, f, types, nested):
    """The source of TypedDict `name` for object field f (nested ones first)."""
    fields = f.get('fields') or {}
    req = {k: v for k, v in fields.items() if v['required']}
    opt = {k: v for k, v in fields.items() if not v['required']}
    body = {}
    for k, v in fields.items():
        sub = name + k[0].upper() + k[1:]
        body[k] = py_type(v, types, nested, sub)
    doc = f['doc'].replace('"""', "'''").replace('\\', '\\\\')
    functional = any(not IDENT.match(k) or keyword.iskeyword(k) for k in fields)
    if functional:
        items = ''.join(f'    {k!r}: {body[k]},  # {field_doc(v)}\n' for k, v in fields.items())
        return (f'#: {doc}\n{name} = TypedDict({name!r}, {{\n{items}}}, total=False)\n')

    def lines(d):
        out = ''
        for k, v in d.items():
            out += f'    {k}: {body[k]}\n'
            out += '    """' + field_doc(v).replace('"""', "'''").replace('\\', '\\\\') + '"""\n'
        return out

    if req and opt:
        return (f'class _{name}Required(TypedDict):\n{lines(req)}\n\n'
                f'class {name}(_{name}Required, total=False):\n    """{doc}"""\n\n{lines(opt)}')
    if req:
        return f'class {name}(TypedDict):\n    """{doc}"""\n\n{lines(req)}'
    if opt:
        return f'class {name}(TypedDict, total=False):\n    """{doc}"""\n\n{lines(opt)}'
    return f'class {name}(TypedDict, total=False):\n    """{doc}"""\n'


def declare(name, f, types):
    nested = []
    if f['type'] == 'object' and f.get('fields'):
        main = typeddict(name, f, types, nested)
    else:
        main = f'#: {f["doc"]}\n{name} = {py_type(f, types, nested, name + "Item")}\n'
    return '\n\n'.join(nested + [main])


def emit(sch):
    types = sch['types']
    o = [S.header('#'),
         '"""The shapes of every operation as they travel over HTTP/JSON.\n\n'
         'Generated from runtime/ops.yaml by tools/gen/out_py.py (docs/schema.md):\n'
         'TypedDicts of the arguments (``<Op>Args``) and results (``<Op>Result``) with\n'
         'the server\'s camelCase keys, the shared types, the error codes.  Units are\n'
         'in each field\'s docstring (durations in ms unless stated, sizes in bytes).\n'
         'models.py turns these dicts into the client\'s dataclasses.\n"""\n\n'
         'from typing import Any, Dict, List, Tuple, TypedDict, Union\n\n'
         '__all__ = ["ERROR_HTTP_STATUS", "OPS"]\n\n'
         '#: Stable error codes (runtime/err.h, docs/protocol.md §4) and their HTTP status.\n'
         'ERROR_HTTP_STATUS: Dict[str, int] = {\n'
         + ''.join(f'    {c!r}: {sch["errors"][c][1]},\n' for c in sorted(sch['errors']))
         + '}\n\n']
    names = []
    for name, f in types.items():
        o.append('\n' + declare(name, f, types) + '\n')
        names.append(name)
    table = []
    for op in sch['ops']:
        if 'internal' in op['flags'] or 'front' in op['flags']:
            continue
        an, rn = args_name(op), result_name(op)
        o.append('\n' + declare(an, {'type': 'object', 'fields': op['args'],
                                     'doc': f"Arguments of ``{op['name']}``: {op['summary']}."},
                                types) + '\n')
        names.append(an)
        if rn not in types:
            r = op['result'] or {'type': 'object', 'doc': 'an empty map'}
            r = dict(r, doc=f"Result of ``{op['name']}``: {r['doc']}")
            o.append('\n' + declare(rn, r, types) + '\n')
            names.append(rn)
        table.append((op['name'], an, rn))
    o.append('\n#: Every operation a client may call: (arguments, result).\n'
             'OPS: Dict[str, Tuple[Any, Any]] = {\n'
             + ''.join(f'    {n!r}: ({a}, {r}),\n' for n, a, r in table) + '}\n')
    o.append('\n__all__ += [\n' + ''.join(f'    {n!r},\n' for n in names) + ']\n')
    return {PATH: ''.join(o)}
