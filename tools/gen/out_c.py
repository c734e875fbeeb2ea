"""tools/gen/out_c.py — the C back-end: the op table with argument specs
(runtime/ops_gen.[ch]), the shard's dispatch tables (actors/ops_gen.[ch]) and
the agent's (container/agent/ops_gen.[ch]).  See docs/schema.md."""
import json
import re

from . import schema as S

C_FLAGS = {'sandbox': 'SBX_OP_SANDBOX', 'nocreate': 'SBX_OP_NOCREATE', 'nowake': 'SBX_OP_NOWAKE',
           'global': 'SBX_OP_GLOBAL', 'mutates': 'SBX_OP_MUTATES', 'stream': 'SBX_OP_STREAM',
           'internal': 'SBX_OP_INTERNAL', 'front': 'SBX_OP_FRONT', 'readonly': 'SBX_OP_READONLY',
           'observe': 'SBX_OP_OBSERVE', 'node': 'SBX_OP_NODE'}
# Which msgpack kinds each schema type accepts (runtime/ops.h enum sbx_arg_kind).
KINDS = {'string': ['STR', 'BIN'], 'bytes': ['STR', 'BIN'], 'enum': ['STR'],
         'integer': ['INT'], 'number': ['INT', 'FLOAT'], 'boolean': ['BOOL'],
         'object': ['MAP'], 'map': ['MAP'], 'array': ['ARRAY'], 'null': [],
         'any': ['STR', 'BIN', 'INT', 'FLOAT', 'BOOL', 'MAP', 'ARRAY']}


def cstr(s):
    return json.dumps(s, ensure_ascii=False) if s is not None else 'NULL'


def ident(name):
    return re.sub(r'[^A-Za-z0-9]', '_', name)


def opid(name):
    return 'SBX_OPID_' + re.sub(r'([a-z])([A-Z])', r'\1_\2', ident(name)).upper()


def client_ops(sch):
    """The ops gateways and shards know: all but the agent's internal ones."""
    return [o for o in sch['ops'] if not (o['layer'] == 'agent' and 'internal' in o['flags'])]


def resolve(f, sch):
    while isinstance(f['type'], str) and f['type'] in sch['types']:
        f = sch['types'][f['type']]
    return f


def kinds(f, sch):
    f = resolve(f, sch)
    ts = f['type'] if isinstance(f['type'], list) else [f['type']]
    out = []
    for t in ts:
        for k in KINDS[t]:
            if k not in out:
                out.append(k)
    return ' | '.join('SBX_ARG_' + k for k in out) or '0'


def typename(f, sch):
    t = f['type']
    if isinstance(t, list):
        return ' or '.join('an ' + x if x[0] in 'aeiou' else 'a ' + x for x in t)
    r = resolve(f, sch)['type']
    r = {'map': 'object', 'enum': 'string', 'bytes': 'string'}.get(r, r)
    if isinstance(r, list):
        return ' or '.join('an ' + x if x[0] in 'aeiou' else 'a ' + x for x in r)
    return ('an ' if r[0] in 'aeiou' else 'a ') + r


def num(v):
    return repr(float(v)) if v is not None else '0'


def runtime_h(sch):
    ops = client_ops(sch)
    lines = [S.header('/*', ' */'),
             '/* The ids of the operations of runtime/ops.yaml (runtime/ops.h). */',
             '#ifndef SBX_OPS_GEN_H', '#define SBX_OPS_GEN_H', '',
             'enum sbx_op_id {']
    for o in ops:
        lines.append(f'    {opid(o["name"])}, /* {o["name"]} */')
    lines += ['    SBX_OPID__COUNT', '};', '', '#endif', '']
    return '\n'.join(lines)


def runtime_c(sch):
    ops = client_ops(sch)
    out = [S.header('/*', ' */'),
           '/* The table of operations, with their argument specs (runtime/ops.h). */',
           '#include "ops.h"', '', '#include "err.h"', '']
    for o in ops:
        for an, a in o['args'].items():
            r = resolve(a, sch)
            if r['type'] == 'enum':
                vals = ', '.join(cstr(v) for v in r['enum'])
                out.append(f'static const char *const enum_{ident(o["name"])}_{ident(an)}[] = '
                           f'{{{vals}, NULL}};')
        if o['args']:
            out.append(f'static const struct sbx_arg args_{ident(o["name"])}[] = {{')
            for an, a in o['args'].items():
                r = resolve(a, sch)
                en = (f'enum_{ident(o["name"])}_{ident(an)}' if r['type'] == 'enum' else 'NULL')
                mn, mx = a.get('min', r.get('min')), a.get('max', r.get('max'))
                ml = a.get('max_len', r.get('max_len', 0))
                out.append(
                    f'    {{{cstr(an)}, {kinds(a, sch)}, {str(a["required"]).lower()}, '
                    f'{str(mn is not None).lower()}, {str(mx is not None).lower()}, '
                    f'{num(mn)}, {num(mx)}, {ml}u, {en}, {cstr(typename(a, sch))}, '
                    f'{cstr(a.get("unit"))}, {S_code(sch, a.get("error"))}}},')
            out.append('};')
    out += ['', 'const struct sbx_op_def sbx_ops[] = {']
    for o in ops:
        fl = [C_FLAGS[f] for f in o['flags']]
        if o['layer'] == 'agent':
            fl.insert(1 if 'sandbox' in o['flags'] else 0, 'SBX_OP_AGENT')
        flags = ' | '.join(fl) or '0'
        ic = S_code(sch, o['idle_code'])
        http = '|'.join(o['rest']['aliases']) or None
        a = f'args_{ident(o["name"])}' if o['args'] else 'NULL'
        out += [f'    {{.name = {cstr(o["name"])},',
                f'     .id = {opid(o["name"])},',
                f'     .flags = {flags},',
                f'     .idle_code = {ic},',
                f'     .idle_empty = {cstr(o["idle_empty"])},',
                f'     .summary = {cstr(o["summary"])},',
                f'     .http = {cstr(http)},',
                f'     .args = {a},',
                f'     .nargs = {len(o["args"])}}},']
    out += ['    {.name = NULL},', '};', '']
    return '\n'.join(out)


def S_code(sch, code):
    return sch['errors'][code][0] if code else '0'


def handlers(sch, layer, pred):
    seen, out = set(), []
    for o in sch['ops']:
        for key in ('handler', 'agent_handler', 'shard_handler'):
            h = o.get(key)
            lay = {'handler': o['layer'], 'agent_handler': 'agent', 'shard_handler': 'shard'}[key]
            if h and lay == layer and pred(o) and h not in seen:
                seen.add(h)
                out.append(h)
    return out


def shard_is_actor(o):
    return 'sandbox' in o['flags']


def actors_h(sch):
    lines = [S.header('/*', ' */'),
             '/*',
             ' * The shard\'s dispatch tables (runtime/ops.yaml `handler` of shard-layer ops).',
             ' * actor_ops[id]: a sandbox op run by its actor (actors/actor.c handle());',
             ' * shard_ops[id]: an op the shard runs itself (an internal op, or its part of',
             ' * a gateway op the gateway fans out).  NULL for the other ops.',
             ' * A handler answers the op (shard_reply_*) exactly once; it owns nothing',
             ' * of `op` beyond that reply.',
             ' */',
             '#ifndef SBX_ACTORS_OPS_GEN_H', '#define SBX_ACTORS_OPS_GEN_H', '',
             '#include "runtime/ops.h"', '',
             'struct actor;', 'struct sop;', '',
             'typedef void actor_op_fn(struct actor *a, struct sop *op);',
             'typedef void shard_op_fn(struct sop *op);', '']
    for h in handlers(sch, 'shard', shard_is_actor):
        lines.append(f'actor_op_fn {h};')
    for h in handlers(sch, 'shard', lambda o: not shard_is_actor(o)):
        lines.append(f'shard_op_fn {h};')
    lines += ['', 'extern actor_op_fn *const actor_ops[SBX_OPID__COUNT];',
              'extern shard_op_fn *const shard_ops[SBX_OPID__COUNT];', '', '#endif', '']
    return '\n'.join(lines)


def actors_c(sch):
    ops = [o for o in client_ops(sch) if o['layer'] == 'shard' or o.get('shard_handler')]
    lines = [S.header('/*', ' */'), '/* The shard\'s dispatch tables: see ops_gen.h. */',
             '#include "actors/ops_gen.h"', '', 'actor_op_fn *const actor_ops[SBX_OPID__COUNT] = {']
    for o in ops:
        if shard_is_actor(o):
            lines.append(f'    [{opid(o["name"])}] = {o["handler"]},')
    lines += ['};', '', 'shard_op_fn *const shard_ops[SBX_OPID__COUNT] = {']
    for o in ops:
        if not shard_is_actor(o):
            lines.append(f'    [{opid(o["name"])}] = {o.get("shard_handler") or o["handler"]},')
    lines += ['};', '']
    return '\n'.join(lines)


def agent_h(sch):
    lines = [S.header('/*', ' */'),
             '/*',
             ' * The agent\'s dispatch table (runtime/ops.yaml `handler` of agent-layer ops,',
             ' * `agent_handler` of shard ops the agent also serves).  A handler owns `r`',
             ' * and answers it (agent_reply_*) or frees it, exactly once.',
             ' */',
             '#ifndef SBX_AGENT_OPS_GEN_H', '#define SBX_AGENT_OPS_GEN_H', '',
             'struct agent;', 'struct agent_req;', '',
             'typedef void agent_op_fn(struct agent *a, struct agent_req *r);', '']
    for h in handlers(sch, 'agent', lambda o: True):
        lines.append(f'agent_op_fn {h};')
    lines += ['', 'struct agent_op {', '    const char *name;', '    agent_op_fn *fn;', '};', '',
              '/* agent_ops — every op the agent serves, NULL-name terminated. */',
              'extern const struct agent_op agent_ops[];', '', '#endif', '']
    return '\n'.join(lines)


def agent_c(sch):
    lines = [S.header('/*', ' */'), '/* The agent\'s dispatch table: see ops_gen.h. */',
             '#include "container/agent/ops_gen.h"', '', '#include <stddef.h>', '',
             'const struct agent_op agent_ops[] = {']
    for o in sch['ops']:
        h = o['handler'] if o['layer'] == 'agent' else o.get('agent_handler')
        if h:
            lines.append(f'    {{{cstr(o["name"])}, {h}}},')
    lines += ['    {NULL, NULL},', '};', '']
    return '\n'.join(lines)


def emit(sch):
    return {'runtime/ops_gen.h': runtime_h(sch), 'runtime/ops_gen.c': runtime_c(sch),
            'actors/ops_gen.h': actors_h(sch), 'actors/ops_gen.c': actors_c(sch),
            'container/agent/ops_gen.h': agent_h(sch), 'container/agent/ops_gen.c': agent_c(sch)}
