#!/usr/bin/python3
"""jupyter_oracle.py SNIPPETS.json — what a real Jupyter kernel returns.

The oracle of tests/integration/test_interp_jupyter.c.  Starts Debian's
ipykernel (python3-ipykernel) through jupyter_client (python3-jupyter-client),
executes each snippet of the JSON list in order in that one kernel, and prints
one JSON list on stdout, one entry per snippet:

    {"status": "ok" | "error",
     "outputs": [["execute_result" | "display_data", [sorted MIME types]], ...],
     "streams": [sorted stream names that received text],
     "error": ename or null}

Messages sbx's result shape has no place for (update_display_data,
clear_output) are left out.  Exit status 0, or 2 when the kernel cannot start
(the message says why).
"""
import json
import os
import sys
import time


def run(kc, code, timeout=60):
    msg_id = kc.execute(code, stop_on_error=False)
    outputs, streams, error = [], set(), None
    deadline = time.time() + timeout
    while True:
        m = kc.get_iopub_msg(timeout=max(0.1, deadline - time.time()))
        if m['parent_header'].get('msg_id') != msg_id:
            continue
        t, c = m['msg_type'], m['content']
        if t == 'status' and c['execution_state'] == 'idle':
            break
        if t == 'stream' and c.get('text'):
            streams.add(c['name'])
        elif t in ('execute_result', 'display_data'):
            outputs.append([t, sorted(c['data'])])
        elif t == 'error':
            error = c['ename']
    while True:
        reply = kc.get_shell_msg(timeout=10)
        if reply['parent_header'].get('msg_id') == msg_id:
            break
    return {'status': reply['content']['status'], 'outputs': outputs,
            'streams': sorted(streams), 'error': error}


def main():
    with open(sys.argv[1]) as f:
        snippets = json.load(f)
    # The Debian kernel's debugpy warns about frozen modules without this.
    os.environ['PYDEVD_DISABLE_FILE_VALIDATION'] = '1'
    try:
        from jupyter_client.manager import KernelManager
        km = KernelManager(kernel_name='python3')
        km.start_kernel()
        kc = km.client()
        kc.start_channels()
        kc.wait_for_ready(timeout=60)
    except Exception as e:  # noqa: BLE001 — reported, not hidden
        print('jupyter_oracle: cannot start a Jupyter kernel: %r' % (e,), file=sys.stderr)
        sys.exit(2)
    try:
        out = [run(kc, code) for code in snippets]
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
    json.dump(out, sys.stdout)


if __name__ == '__main__':
    main()
