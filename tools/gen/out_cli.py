"""tools/gen/out_cli.py — the CLI back-end: tools/cli_ops_gen.[ch], a plain C
copy of what `sbx help` and `sbx call` need of each operation a client may
send (name, summary, CLI verb and positionals, argument specs).  The CLI uses
only the public client API (include/sbx/sbx.h), so it gets its own copy of the
table instead of runtime/ops_gen.c; tools/cli_schema.c checks arguments by the
same rules as runtime/ops.c sbx_op_check_args.  See docs/schema.md."""
import json
import os
import re

from . import schema as S
from .out_c import client_ops, ident, resolve, typename

# The JSON kinds (tools/cli_ops_gen.h enum cli_kind) each msgpack kind of
# runtime/ops.h corresponds to: a JSON string is encoded as a msgpack str.
KINDS = {'string': ['STR'], 'bytes': ['STR'], 'enum': ['STR'], 'integer': ['INT'],
         'number': ['INT', 'REAL'], 'boolean': ['BOOL'], 'object': ['OBJECT'],
         'map': ['OBJECT'], 'array': ['ARRAY'], 'null': [],
         'any': ['STR', 'INT', 'REAL', 'BOOL', 'OBJECT', 'ARRAY']}


def cstr(s):
    return json.dumps(s, ensure_ascii=False) if s is not None else 'NULL'


def kinds(f, sch):
    f = resolve(f, sch)
    ts = f['type'] if isinstance(f['type'], list) else [f['type']]
    out = []
    for t in ts:
        for k in KINDS[t]:
            if k not in out:
                out.append(k)
    return ' | '.join('CLI_K_' + k for k in out) or '0'


def num(v):
    return repr(float(v)) if v is not None else '0'


def cli_ops(sch):
    """The ops a client may send: the gateway answers the others UNKNOWN_OPERATION."""
    return [o for o in client_ops(sch) if 'internal' not in o['flags']]


def max_duration_ms():
    """SBX_WIRE_MAX_DURATION_MS of runtime/wire.h, evaluated (the CLI cannot include it)."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    with open(os.path.join(root, 'runtime/wire.h'), encoding='utf-8') as f:
        m = re.search(r'#define SBX_WIRE_MAX_DURATION_MS \(([0-9LL *]+)\)', f.read())
    if not m:
        raise S.SchemaError('runtime/wire.h: no SBX_WIRE_MAX_DURATION_MS (N * N ...)')
    v = 1
    for x in m.group(1).replace('LL', '').split('*'):
        v *= int(x)
    return v


def header_h(sch):
    return '\n'.join([
        S.header('/*', ' */'),
        '/*',
        ' * cli_ops_gen.h — the operations a client may send, with their argument',
        ' * specs, for `sbx help` and `sbx call` (tools/cli_schema.c).  A generated copy',
        ' * of runtime/ops.yaml\'s data, so the CLI needs nothing but the public API.',
        ' * Everything here is static and read-only.',
        ' */',
        '#ifndef SBX_CLI_OPS_GEN_H', '#define SBX_CLI_OPS_GEN_H', '',
        '#include <stdbool.h>', '',
        '/* SBX_WIRE_MAX_DURATION_MS of runtime/wire.h: the bound of the duration',
        ' * arguments every op shares (runtime/ops.c check_durations). */',
        f'#define CLI_MAX_DURATION_MS {max_duration_ms()}LL', '',
        '/* The JSON kinds an argument accepts (a bit set).  An integral real',
        ' * (3.0) is accepted where CLI_K_INT is, as runtime/ops.c does. */',
        'enum cli_kind {',
        '    CLI_K_STR = 1 << 0,',
        '    CLI_K_INT = 1 << 1,',
        '    CLI_K_REAL = 1 << 2,',
        '    CLI_K_BOOL = 1 << 3,',
        '    CLI_K_OBJECT = 1 << 4,',
        '    CLI_K_ARRAY = 1 << 5,',
        '};', '',
        '/* One top-level argument of an op (runtime/ops.yaml `args`). */',
        'struct cli_arg {',
        '    const char *name;',
        '    unsigned kinds;             /* enum cli_kind bits; JSON null = absent */',
        '    bool required;',
        '    bool has_min, has_max;      /* numeric bounds, inclusive, in `unit` */',
        '    double min, max;',
        '    unsigned max_len;           /* bytes of a string, items, entries; 0 = none */',
        '    const char *const *enums;   /* allowed strings, NULL-terminated, or NULL */',
        '    const char *type;           /* "a string", "an integer", ... (messages) */',
        '    const char *unit;           /* "ms", "bytes", ... or NULL */',
        '    const char *def;            /* the default as JSON text, or NULL */',
        '    const char *doc;            /* one line */',
        '    const char *code;           /* the wire code a failed check answers */',
        '};', '',
        '/* One operation. */',
        'struct cli_op {',
        '    const char *name;           /* the wire name: "exec", "files.read", ... */',
        '    const char *summary;',
        '    const char *verb;           /* the CLI verb running it, or NULL (only `sbx call`) */',
        '    const char *positionals;    /* the verb\'s positionals: "sandbox path", or "" */',
        '    bool sandbox;               /* it needs a sandbox ID */',
        '    const struct cli_arg *args; /* nargs of them, in declaration order */',
        '    unsigned nargs;',
        '};', '',
        '/* cli_ops — every op a client may send, in schema order; NULL-name terminated. */',
        'extern const struct cli_op cli_ops[];', '',
        '#endif', ''])


def body_c(sch):
    out = [S.header('/*', ' */'),
           '/* The operations a client may send: see cli_ops_gen.h. */',
           '#include "cli_ops_gen.h"', '', '#include <stddef.h>', '']
    ops = cli_ops(sch)
    for o in ops:
        oi = ident(o['name'])
        for an, a in o['args'].items():
            r = resolve(a, sch)
            if r['type'] == 'enum':
                vals = ', '.join(cstr(v) for v in r['enum'])
                out.append(f'static const char *const enum_{oi}_{ident(an)}[] = {{{vals}, NULL}};')
        if not o['args']:
            continue
        out.append(f'static const struct cli_arg args_{oi}[] = {{')
        for an, a in o['args'].items():
            r = resolve(a, sch)
            en = f'enum_{oi}_{ident(an)}' if r['type'] == 'enum' else 'NULL'
            mn, mx = a.get('min', r.get('min')), a.get('max', r.get('max'))
            ml = a.get('max_len', r.get('max_len', 0))
            dv = a.get('default', r.get('default'))
            dv = json.dumps(dv) if dv is not None else None
            out += [f'    {{{cstr(an)}, {kinds(a, sch)}, {str(a["required"]).lower()}, '
                    f'{str(mn is not None).lower()}, {str(mx is not None).lower()}, '
                    f'{num(mn)}, {num(mx)}, {ml}u, {en},',
                    f'     {cstr(typename(a, sch))}, {cstr(a.get("unit"))}, {cstr(dv)},',
                    f'     {cstr(a["doc"])},',
                    f'     {cstr(a.get("error", "VALIDATION_FAILED"))}}},']
        out.append('};')
    out += ['', 'const struct cli_op cli_ops[] = {']
    for o in ops:
        cli = o['cli']
        verb = cli['verb'] if cli else None
        pos = ' '.join(cli['args']) if cli else ''
        a = f'args_{ident(o["name"])}' if o['args'] else 'NULL'
        out += [f'    {{{cstr(o["name"])}, {cstr(o["summary"])},',
                f'     {cstr(verb)}, {cstr(pos)}, {str("sandbox" in o["flags"]).lower()}, '
                f'{a}, {len(o["args"])}}},']
    out += ['    {NULL, NULL, NULL, NULL, false, NULL, 0},', '};', '']
    return '\n'.join(out)


def emit(sch):
    return {'tools/cli_ops_gen.h': header_h(sch), 'tools/cli_ops_gen.c': body_c(sch)}
