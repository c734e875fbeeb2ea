#!/usr/bin/python3
"""jupyter_bench.py [--starts N] [--runs N] — the Jupyter side of sbx-bench-interp.

Times what the sbx code interpreter is compared with (issue: "side by side in
one run"), on Debian's ipykernel (python3-ipykernel) driven by jupyter_client
(python3-jupyter-client), the way a Jupyter front end does:

  kernel start   KernelManager.start_kernel() + client start_channels() +
                 wait_for_ready(): from nothing to a kernel that answers
                 (N starts, each kernel shut down after)
  1+1 round trip execute_request("1+1") sent on the shell channel until its
                 execute_reply and the iopub status idle have arrived
                 (N runs after 20 warm-up runs, one kernel)

Prints one JSON object on stdout: {"kernel_start_ms": [...], "execute_ms": [...]}
(raw samples; sbx-bench-interp computes the percentiles).
"""
import json
import os
import sys
import time

os.environ["PYDEVD_DISABLE_FILE_VALIDATION"] = "1"


def arg(name, default):
    if name in sys.argv:
        return int(sys.argv[sys.argv.index(name) + 1])
    return default


def execute(kc, code):
    msg_id = kc.execute(code, store_history=False)
    reply = idle = False
    while not (reply and idle):
        if not reply:
            m = kc.get_shell_msg(timeout=30)
            reply = m["parent_header"].get("msg_id") == msg_id
        if not idle:
            m = kc.get_iopub_msg(timeout=30)
            idle = (m["parent_header"].get("msg_id") == msg_id and m["msg_type"] == "status"
                    and m["content"]["execution_state"] == "idle")


def main():
    from jupyter_client.manager import KernelManager
    starts, runs = arg("--starts", 5), arg("--runs", 500)
    out = {"kernel_start_ms": [], "execute_ms": []}
    km = kc = None
    for i in range(starts):
        t = time.perf_counter()
        km = KernelManager(kernel_name="python3")
        km.start_kernel()
        kc = km.client()
        kc.start_channels()
        kc.wait_for_ready(timeout=60)
        out["kernel_start_ms"].append((time.perf_counter() - t) * 1000)
        if i < starts - 1:
            kc.stop_channels()
            km.shutdown_kernel(now=True)
    for _ in range(20):
        execute(kc, "1+1")
    for _ in range(runs):
        t = time.perf_counter()
        execute(kc, "1+1")
        out["execute_ms"].append((time.perf_counter() - t) * 1000)
    kc.stop_channels()
    km.shutdown_kernel(now=True)
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
