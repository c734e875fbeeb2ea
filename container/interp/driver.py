#!/usr/bin/python3
"""sbx Python code-interpreter driver: one process per code context.

The sandbox agent (container/agent/interp.c) starts one driver per code
context; the context's state (variables, imports, open figures) *is* this
process's state.  Run it with the Debian interpreter:

    /usr/bin/python3 -u driver.py

or, usually, as a fork of `driver.py --fork-server` (see fork_server()):
the same driver, a few milliseconds after the agent asks for it.

File descriptors
    0   /dev/null
    1   pipe read by the agent: fd-level stdout only (subprocesses,
        C extensions, os.write(1, ...)); print() never lands here
    2   same for stderr
    3   requests, read by the driver
    4   events, written by the driver

Framing on fd 3 and fd 4: JSON Lines, one UTF-8 JSON object per line,
terminated by "\\n" (never a raw newline inside a message).

On start-up the driver writes one event:
    {"type":"ready","pid":N,"language":"python","mode":"ipython"|"stdlib",
     "version":"3.11.2"}
IPython mode (an IPython InteractiveShell wired like ipykernel's
ZMQInteractiveShell, so outputs match Jupyter) is used when `import IPython`
works; otherwise the standard-library mode, which speaks the same protocol.

Requests (fd 3), handled strictly one at a time, in order:
    {"type":"init","id":..,"cwd":"/path","env":{"K":"v"}}
        chdir + os.environ.update (a null value unsets the variable); used
        when a pre-started ("warm") driver becomes a context.
    {"type":"execute","id":..,"code":".."}
        run one cell.
Every request ends with exactly one "done" event.

Events (fd 4), each carrying the request's "id" (ready excepted):
    {"type":"stream","name":"stdout"|"stderr","text":..}
        print()/sys.stdout/sys.stderr output, streamed while the cell runs:
        a newline flushes at once (bursts within 10 ms are coalesced), any
        buffered text is flushed within 25 ms or at 8 KiB, an event carries
        at most 64 Ki characters, and streams are always flushed before any
        other event.  An output over 32 MiB is replaced by a stderr note (the
        agent refuses event lines over 64 MiB).
    {"type":"display_data","data":{mime: value},"metadata":{..}}
        display(), IPython.display objects, matplotlib figures; "transient":
        {"display_id": ..} is added when a display id is used
    {"type":"execute_result","execution_count":n,"data":{..},"metadata":{..}}
        the value of the cell's last expression (not None, no trailing ';')
    {"type":"error","ename":..,"evalue":..,"traceback":[..]}
        traceback without ANSI colours and without the driver's frames (IPython
        mode: IPython's entries, as Jupyter sends them; stdlib mode: lines)
    {"type":"done","status":"ok"|"error","execution_count":n}
        always last ("execution_count" only for execute); a failed cell
        always has an error event before it
    display_data and execute_result of a matplotlib figure shown as PNG also
    carry "chart": {type: line|bar|scatter|pie|histogram|heatmap|unknown,
    title?, data, layout, library: "matplotlib"} (the SDK's ChartData, see
    figure_chart()); it is not part of the MIME bundle, which stays Jupyter's.
    Extensions (Jupyter's vocabulary, safe to ignore):
    {"type":"update_display_data",...}  display(..., display_id=X, update=True)
    {"type":"clear_output","wait":bool} IPython.display.clear_output()

Mime bundles: text types are strings, image/png / image/jpeg /
application/pdf are base64 strings, application/json is a JSON value;
text/plain is always present in execute_result.  Formatting follows
IPython's rules (_repr_mimebundle_ first, then _repr_html_, _markdown_,
_svg_, _png_, _pdf_, _jpeg_, _latex_, _json_, _javascript_; None skips a
type; a tuple is (data, metadata); classes are not rich-formatted).

Behaviour worth knowing
  * SIGINT while a cell runs raises KeyboardInterrupt in the cell (an
    interrupted `await` is cancelled and reported as KeyboardInterrupt too);
    SIGINT while idle is ignored, so is a repeat within 0.2 s of the first.
    The driver's SIGINT handler is restored after every cell, as ipykernel.
  * SystemExit is reported as an error, never obeyed; exit()/quit() do not
    end the context either.  EOF on fd 3 -> atexit handlers, exit status 0.
  * Top-level `await` runs on one persistent asyncio event loop.
  * matplotlib: unless MPLBACKEND names another backend ("Agg" counts as
    unset), figures drawn during a cell are displayed as image/png at the
    end of the cell (or at plt.show()) and then closed, as ipykernel's inline
    backend does (stdlib mode: an equivalent Agg-based backend); figures
    without axes are not displayed (Jupyter shows their text/plain repr).
  * sys.path[0] is "" (the context's cwd), as in the REPL.
  * A forked child (os.fork, multiprocessing) writes its print() output to
    fd 1/2 and never touches fd 3/4; one that returns from the cell exits.
  * stdlib mode accepts a `%matplotlib ...` line (its default behaviour
    anyway); other IPython syntax (magics, !cmd) needs IPython mode.

Environment
    SBX_PY_MODE=stdlib|ipython   force a mode (default: ipython if importable)

Code
    This file is the entry point; the driver is the package _sbx_driver/
    beside it (both installed by tools/install-interp.sh into
    share/sbx/interp, bound at /opt/sbx in sandboxes), imported from here
    before the driver replaces sys.path[0] (this directory) with "":
        proto       file descriptors, limits, which code is the driver's own
        interrupts  SIGINT -> KeyboardInterrupt in a running cell
        channel     the event channel (fd 4): JSON Lines
        output      sys.stdout/sys.stderr as `stream` events
        mplhooks    import hooks; matplotlib figures shown at a cell's end
        chart       a figure as the SDK's ChartData
        errors      tracebacks without the driver's frames
        formatting  MIME bundles (stdlib mode)
        runner      BaseRunner and the stdlib mode's runner
        ipython     the IPython mode's runner
        server      Driver (the request loop) and the fork server
"""

from _sbx_driver.server import main

if __name__ == "__main__":
    main()
