"""tools/gen — the generators fed by runtime/ops.yaml (see docs/schema.md).

schema.py loads and checks the schema and normalizes it (load()).  Every
module here named out_*.py is an output back-end: it defines

    def emit(schema) -> dict[str, str]   # repository-relative path -> file text

and tools/gen_ops.py runs every such module (sorted by name), so adding a
back-end is adding one file; nothing else is registered anywhere.  Each
emitted file must start with schema.header(<comment prefix>) (JSON outputs,
which have no comments, carry it as a "$comment" member).
"""
