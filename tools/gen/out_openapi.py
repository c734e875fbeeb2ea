"""tools/gen/out_openapi.py — the typed OpenAPI 3.1 document of the HTTP API.

emit(schema) writes

  gateway/openapi.json   the document (committed; tests/openapi checks it with
                         a real OpenAPI 3.1 validator and real answers of sbxd)
  gateway/openapi_gen.c  the same bytes as a C string, sbx_openapi_json
                         (gateway/openapi_gen.h), served at GET /v1/openapi.json

Every route gateway/http.c serves is in it: each op's canonical route
(POST /v1/sandboxes/{sandbox}/<op>, POST /v1/<op> for a global op) and its
REST aliases, with the request body as the JSON Schema (2020-12, the dialect
of OpenAPI 3.1) of the op's `args` and the 200 answer as that of its
`result`; the front's own routes (health, this document, SSE streams, raw
files, the terminal) are described here, as http.c hard-codes them. Errors
answer the envelope of docs/protocol.md §4 (`Error`), one response per HTTP
status the op's codes map to (runtime/err.h), plus `default`. Stream ops
also answer `text/event-stream` (with `Accept: text/event-stream`).

The schema → JSON Schema mapping (json_schema()) is shared by the other
back-ends; a result object's `additional` becomes its `additionalProperties`
(false unless the schema allows unlisted members); request objects leave it
open, as the server ignores unknown arguments (docs/schema.md).
"""
import json

from gen import schema as S

DOC_PATH = 'gateway/openapi.json'
C_PATH = 'gateway/openapi_gen.c'
REF = '#/components/schemas/'

UNIT_TEXT = {'bytes': 'bytes', 'ms': 'milliseconds', 's': 'seconds',
             'seconds-or-duration': 'a duration: "30s", "10m", "1h", or a number of seconds'}


def pascal(op_name):
    """exec.stream -> ExecStream, process.waitForLog -> ProcessWaitForLog."""
    out = ''
    for part in op_name.split('.'):
        out += part[0].upper() + part[1:]
    return out


def args_name(op):
    return pascal(op['name']) + 'Args'


def result_name(op):
    """The component name of an op's result: the named type itself when the
    result is a bare reference to one, else <Op>Result."""
    r = op['result']
    if r and isinstance(r['type'], str) and r['type'] not in S.TYPES and set(r) <= {
            'type', 'doc', 'required'}:
        return r['type']
    return pascal(op['name']) + 'Result'


def describe(f):
    """The description of a field: its doc, its unit and its bounds in words."""
    d = f['doc']
    extra = []
    if 'unit' in f:
        extra.append(UNIT_TEXT[f['unit']])
    if f.get('max_len') is not None and f['type'] in ('string', 'bytes'):
        extra.append(f"at most {f['max_len']} bytes")
    if extra:
        d += ' (' + '; '.join(extra) + ')'
    return d


def json_schema(f, types, result):
    """The JSON Schema of a field.  result: closed objects get
    additionalProperties false (in a request unknown members are ignored)."""
    t = f['type']
    s = {}
    if isinstance(t, list):
        s['type'] = list(t)
        if 'array' in t and 'items' in f:
            s['items'] = json_schema(f['items'], types, result)
    elif t in types:
        s['$ref'] = REF + t
    elif t == 'string':
        s['type'] = 'string'
    elif t == 'bytes':
        # msgpack bin over nng; over HTTP a UTF-8 string, or base64 with
        # X-Sbx-Binary: base64 (docs/http.md).
        s['type'] = 'string'
    elif t in ('integer', 'number', 'boolean'):
        s['type'] = t
    elif t == 'enum':
        s['type'] = 'string'
        s['enum'] = list(f['enum'])
    elif t == 'array':
        s['type'] = 'array'
        s['items'] = json_schema(f['items'], types, result)
    elif t == 'map':
        s['type'] = 'object'
        s['additionalProperties'] = json_schema(f['values'], types, result)
    elif t == 'object':
        s['type'] = 'object'
        props, req = {}, []
        for k, v in (f.get('fields') or {}).items():
            props[k] = json_schema(v, types, result)
            if v['required']:
                req.append(k)
        if props or not f.get('additional'):
            s['properties'] = props
        if req:
            s['required'] = req
        if result:
            # What the schema says: a closed shape, or one that may carry
            # members it does not list (tests/openapi checks answers by it).
            s['additionalProperties'] = bool(f.get('additional'))
    elif t == 'any':
        pass
    else:
        raise S.SchemaError(f'openapi: no JSON Schema for type {t!r}')
    if 'enum' in f and t != 'enum':
        s['enum'] = list(f['enum'])
    if 'min' in f:
        s['minimum'] = f['min']
    if 'max' in f:
        s['maximum'] = f['max']
    if f.get('max_len') is not None:
        tl = t if isinstance(t, list) else [t]
        if 'array' in tl:
            s['maxItems'] = f['max_len']
        elif 'map' in tl:
            s['maxProperties'] = f['max_len']
        elif 'string' in tl or 'bytes' in tl:
            s['maxLength'] = f['max_len']  # bytes bound the characters too
    if 'default' in f:
        s['default'] = f['default']
    if f.get('doc'):
        s['description'] = describe(f)
    if 'unit' in f:
        s['x-unit'] = f['unit']
    return s


def args_schema(op, types):
    """The request body: the op's `args` as an object (members optional
    unless required; unknown ones ignored by the server)."""
    props, req = {}, []
    for k, v in op['args'].items():
        props[k] = json_schema(v, types, False)
        if v['required']:
            req.append(k)
    s = {'type': 'object', 'properties': props,
         'description': f"Arguments of {op['name']} (docs/protocol.md §3)."}
    if req:
        s['required'] = req
    return s


def result_schema(op, types):
    r = op['result']
    if r is None:
        return {'type': 'object', 'properties': {}, 'additionalProperties': False,
                'description': f"{op['name']} answers an empty map."}
    return json_schema(r, types, True)


ERROR_SCHEMA_DOC = 'The error envelope (docs/protocol.md §4): a stable code, a message, a context.'


def error_schema(sch):
    codes = sorted(sch['errors'])
    return {
        'type': 'object',
        'description': ERROR_SCHEMA_DOC,
        'properties': {
            'code': {'type': 'string', 'enum': codes,
                     'description': 'stable error code (runtime/err.h, docs/protocol.md §4)'},
            'message': {'type': 'string', 'description': 'what went wrong, for people'},
            'context': {'type': 'object', 'description':
                        'details: sandboxId and operation where known, plus fields of the code'},
            'httpStatus': {'type': 'integer', 'description': 'the HTTP status of the answer'},
            'operation': {'type': 'string', 'description':
                          'the operation of the route, when the route is an operation\'s'},
        },
        'required': ['code', 'message', 'context', 'httpStatus'],
        'additionalProperties': False,
    }


def error_responses(codes, sch):
    """{status: response} for the op's codes, plus default."""
    by_status = {}
    for c in codes:
        st = sch['errors'][c][1]
        by_status.setdefault(st, []).append(c)
    out = {}
    for st in sorted(by_status):
        if st < 400:
            continue
        out[str(st)] = {
            'description': ', '.join(sorted(set(by_status[st]))),
            'content': {'application/json': {'schema': {'$ref': REF + 'Error'}}},
        }
    out['default'] = {'description': 'an error (docs/protocol.md §4)',
                      'content': {'application/json': {'schema': {'$ref': REF + 'Error'}}}}
    return out


def path_params(route, op, types):
    """(OpenAPI path template, [parameter objects]) of a route 'METHOD /path'."""
    segs = route.split('/')
    tpl, params = [], []
    for seg in segs:
        if not seg.startswith('{'):
            tpl.append(seg)
            continue
        inner = seg[1:-1]
        rest = inner.endswith('*')
        is_int = inner.endswith(':int')
        name = inner.split(':')[0].rstrip('*')
        tpl.append('{' + name + '}')
        if name == 'sandbox':
            sch = {'type': 'string', 'minLength': 1, 'maxLength': 63,
                   'pattern': '^[a-z0-9]([a-z0-9-]*[a-z0-9])?$'}
            doc = 'sandbox ID (1-63 of [a-z0-9-], docs/protocol.md §1)'
        elif rest:
            sch = {'type': 'string'}
            doc = 'absolute path inside the sandbox, slashes included'
        else:
            f = op['args'].get(name) if op else None
            if f is not None:
                sch = json_schema(f, types, False)
                sch.pop('description', None)
                sch.pop('default', None)
                doc = describe(f)
            else:
                sch = {'type': 'integer' if is_int else 'string'}
                doc = 'operation argument of the same name'
            if is_int:
                sch['type'] = 'integer'
        params.append({'name': name, 'in': 'path', 'required': True, 'schema': sch,
                       'description': doc})
    return '/'.join(tpl), params


def query_params(op, used, types):
    """Query parameters of a GET/DELETE alias: the op's string arguments not
    in the path (the front turns query parameters into string arguments)."""
    out = []
    for k, f in op['args'].items():
        if k in used or f['type'] not in ('string', 'enum'):
            continue
        sch = json_schema(f, types, False)
        sch.pop('description', None)
        out.append({'name': k, 'in': 'query', 'required': bool(f['required']), 'schema': sch,
                    'description': describe(f)})
    return out


SECURITY = [{'bearer': []}]


def op_operation(op, method, route, canonical, sch):
    types = sch['types']
    tpl, params = path_params(route, op, types)
    used = {p['name'] for p in params}
    o = {'operationId': op['name'] if canonical else f"{op['name']}.{method}",
         'summary': op['summary'],
         'tags': [op['name'].split('.')[0] if '.' in op['name'] else 'sandbox']}
    desc = []
    if op['doc']:
        desc.append(op['doc'])
    if not canonical:
        desc.append(f"REST alias of {op['rest']['canonical']}.")
    desc.append(f"Runs in the {op['layer']}"
                + ('; changes durable state (answered after commit)' if 'mutates' in op['flags'] else '')
                + ('; idempotent' if op['idempotent'] else '') + '. See docs/protocol.md §3.')
    o['description'] = ' '.join(desc)
    if method in ('get', 'delete'):
        params += query_params(op, used, types)
    if params:
        o['parameters'] = params
    if method == 'post':
        body = {'$ref': REF + args_name(op)}
        o['requestBody'] = {
            'required': any(f['required'] for k, f in op['args'].items() if k not in used),
            'content': {'application/json': {'schema': body}}}
    ok = {'application/json': {'schema': {'$ref': REF + result_name(op)}}}
    if 'stream' in op['flags']:
        ok['text/event-stream'] = {
            'schema': {'type': 'string',
                       'description': 'with Accept: text/event-stream: the stream as '
                                      'Server-Sent Events (docs/http.md)'}}
    responses = {'200': {'description': op['summary'], 'content': ok}}
    responses.update(error_responses(sch['common_errors'] + op['errors']
                                     + ([op['idle_code']] if op['idle_code'] else []), sch))
    o['responses'] = responses
    o['security'] = SECURITY
    return tpl, o


def front_routes(sch):
    """The HTTP front's own routes (gateway/http.c routes_build)."""
    err = error_responses(['UNAUTHORIZED', 'SANDBOX_NOT_FOUND', 'STREAM_NOT_FOUND',
                           'FILE_NOT_FOUND', 'VALIDATION_FAILED']
                          if 'SANDBOX_NOT_FOUND' in sch['errors'] else [], sch)
    sb = {'name': 'sandbox', 'in': 'path', 'required': True,
          'schema': {'type': 'string', 'minLength': 1, 'maxLength': 63,
                     'pattern': '^[a-z0-9]([a-z0-9-]*[a-z0-9])?$'},
          'description': 'sandbox ID (1-63 of [a-z0-9-], docs/protocol.md §1)'}
    path = {'name': 'path', 'in': 'path', 'required': True, 'schema': {'type': 'string'},
            'description': 'absolute path inside the sandbox, slashes included'}
    sid = {'name': 'streamId', 'in': 'path', 'required': True, 'schema': {'type': 'string'},
           'description': 'the stream ID an operation answered'}
    fw = next((o for o in sch['ops'] if o['name'] == 'file.write'), None)
    return [
        ('/v1/health', 'get', {
            'operationId': 'health', 'summary': 'liveness of the HTTP front', 'tags': ['front'],
            'responses': {'200': {'description': 'the front is up', 'content': {
                'application/json': {'schema': {
                    'type': 'object', 'properties': {'ok': {'type': 'boolean', 'const': True}},
                    'required': ['ok'], 'additionalProperties': False}}}}}}),
        ('/v1/openapi.json', 'get', {
            'operationId': 'openapi', 'summary': 'this document', 'tags': ['front'],
            'responses': {'200': {'description': 'the OpenAPI 3.1 document', 'content': {
                'application/json': {'schema': {'type': 'object'}}}}}}),
        ('/v1/sandboxes/{sandbox}/streams/{streamId}', 'get', {
            'operationId': 'stream.events',
            'summary': "a stream's events as Server-Sent Events (resume with Last-Event-ID)",
            'tags': ['stream'],
            'parameters': [sb, sid,
                           {'name': 'Last-Event-ID', 'in': 'header', 'required': False,
                            'schema': {'type': 'string'},
                            'description': 'resume after this event (its seq)'}],
            'responses': {'200': {'description': 'the events, one SSE event each', 'content': {
                'text/event-stream': {'schema': {'type': 'string'}}}}, **err},
            'security': SECURITY}),
        ('/v1/sandboxes/{sandbox}/files/{path}', 'get', {
            'operationId': 'file.get', 'summary': "a file's raw bytes", 'tags': ['file'],
            'parameters': [sb, path],
            'responses': {'200': {'description': 'the bytes; Content-Type is the detected MIME type',
                                  'content': {'application/octet-stream': {
                                      'schema': {'type': 'string', 'format': 'binary'}}}},
                          **err},
            'security': SECURITY}),
        ('/v1/sandboxes/{sandbox}/files/{path}', 'put', {
            'operationId': 'file.put', 'summary': 'write a file from the raw request body',
            'tags': ['file'],
            'parameters': [sb, path],
            'requestBody': {'required': True, 'content': {'application/octet-stream': {
                'schema': {'type': 'string', 'format': 'binary'}}}},
            'responses': {'200': {'description': "file.write's result", 'content': {
                'application/json': {'schema': {'$ref': REF + result_name(fw)} if fw else
                                     {'type': 'object'}}}}, **err},
            'security': SECURITY}),
        ('/v1/sandboxes/{sandbox}/terminal', 'get', {
            'operationId': 'terminal',
            'summary': "the session's terminal over WebSocket (docs/http.md)", 'tags': ['terminal'],
            'parameters': [sb],
            'responses': {'101': {'description': 'switching to WebSocket'}, **err},
            'security': SECURITY}),
        ('/v1/sandboxes/{sandbox}/url-token', 'post', {
            'operationId': 'url-token',
            'summary': ("a short-lived token (60 s unless ttlMs asks less) for ?access_token= on "
                        "this sandbox's terminal, streams or file downloads (docs/http.md, "
                        "Tokens in URLs)"),
            'tags': ['front'],
            'parameters': [sb, {'name': 'purpose', 'in': 'query', 'required': True,
                                'schema': {'type': 'string',
                                           'enum': ['terminal', 'stream', 'file']},
                                'description': 'the route the token opens'},
                               {'name': 'ttlMs', 'in': 'query', 'required': False,
                                'schema': {'type': 'integer', 'minimum': 1000,
                                           'maximum': 60000, 'default': 60000},
                                # gateway/http_int.h HTTP_URL_TOKEN_MIN_TTL_MS, _TTL_MS
                                'description': "the token's life from its minting, ms"}],
            'responses': {'200': {'description': 'the token', 'content': {
                'application/json': {'schema': {
                    'type': 'object',
                    'properties': {'token': {'type': 'string'},
                                   'purpose': {'type': 'string'},
                                   'sandbox': {'type': 'string'},
                                   'expiresAt': {'type': 'integer',
                                                 'description': 'ms since the Unix epoch'},
                                   'ttlMs': {'type': 'integer'}},
                    'required': ['token', 'purpose', 'sandbox', 'expiresAt', 'ttlMs'],
                    'additionalProperties': False}}}}, **err},
            'security': SECURITY}),
    ]


def document(sch):
    types = sch['types']
    comps = {'Error': error_schema(sch)}
    for name, f in types.items():
        comps[name] = json_schema(f, types, True)
    paths = {}

    def put(tpl, method, o):
        item = paths.setdefault(tpl, {})
        if method in item:
            raise S.SchemaError(f'openapi: {method.upper()} {tpl} is declared twice')
        item[method] = o

    for tpl, m, o in front_routes(sch):
        put(tpl, m, o)
    for op in sch['ops']:
        if op['rest']['canonical'] is None:
            continue
        shapes = [(args_name(op), args_schema(op, types))]
        if result_name(op) not in types:
            shapes.append((result_name(op), result_schema(op, types)))
        for n, s in shapes:
            if n in comps and comps[n] != s:
                raise S.SchemaError(f'openapi: component {n} is both a type and an op shape')
            comps[n] = s
        routes = [(op['rest']['canonical'], True)] + [(a, False) for a in op['rest']['aliases']]
        for r, canonical in routes:
            method, route = r.split(' ', 1)
            tpl, o = op_operation(op, method.lower(), route, canonical, sch)
            put(tpl, method.lower(), o)
    return {
        'openapi': '3.1.0',
        'x-generated': S.HEADER,
        'info': {'title': 'sbx HTTP API', 'version': '1',
                 'description': 'Every operation of the sbx protocol (docs/protocol.md) over '
                                'HTTP/JSON (docs/http.md), with the JSON Schema of its '
                                'arguments and result. Generated from runtime/ops.yaml.'},
        'jsonSchemaDialect': 'https://spec.openapis.org/oas/3.1/dialect/base',
        'paths': paths,
        'components': {'schemas': comps,
                       'securitySchemes': {'bearer': {'type': 'http', 'scheme': 'bearer'}}},
    }


def c_string(text):
    """text as C string literals, one per line (with '?' escaped: no trigraphs)."""
    out = []
    for line in text.splitlines(True):
        esc = (line.replace('\\', '\\\\').replace('"', '\\"').replace('?', '\\?')
               .replace('\n', '\\n'))
        out.append(f'    "{esc}"\n')
    return ''.join(out)


def emit(sch):
    text = json.dumps(document(sch), indent=1, sort_keys=True, ensure_ascii=False) + '\n'
    c = (S.header('/*', ' */')
         + '/* openapi_gen.c — the OpenAPI document (gateway/openapi.json) served at\n'
           ' * GET /v1/openapi.json; see gateway/openapi_gen.h and tools/gen/out_openapi.py. */\n'
           '#include "openapi_gen.h"\n\n'
           'const char sbx_openapi_json[] =\n' + c_string(text) + '    ;\n\n'
         f'const size_t sbx_openapi_json_len = sizeof(sbx_openapi_json) - 1;\n')
    return {DOC_PATH: text, C_PATH: c}
