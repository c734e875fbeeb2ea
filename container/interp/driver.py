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
"""

import builtins
import io
import json
import os
import signal
import sys
import threading
import time
import types

REQ_FD = 3
EV_FD = 4
FLUSH_INTERVAL = 0.025      # max age of buffered stream text
NEWLINE_GAP = 0.010         # a newline flushes at once if the last flush is older
CHUNK_CHARS = 8192          # buffered stream text is flushed at this size
STREAM_EVENT_CHARS = 1 << 16    # one huge write is split into events this big
MAX_EVENT_BYTES = 32 << 20  # the agent declares a driver dead at a 64 MiB line
INLINE_IPYTHON = "module://matplotlib_inline.backend_inline"
INLINE_STDLIB = "module://_sbx_mpl_inline"
_THIS_FILE = __file__


def _version():
    return "%d.%d.%d" % sys.version_info[:3]


# --------------------------------------------------------------------------
# Interrupts
# --------------------------------------------------------------------------

class Interrupts:
    """SIGINT policy: ignored while idle, KeyboardInterrupt while a cell runs.

    The main thread also writes protocol events; a KeyboardInterrupt raised
    in the middle of os.write() would leave half a JSON line on fd 4, or a
    lock held forever.  Such sections run with `critical` > 0: a SIGINT that
    arrives then is remembered and raised as soon as the section ends.

    The request loop's own functions are `shielded`: a SIGINT that finds one
    of them running (just before or after the cell) is dropped, so the loop
    itself never sees a KeyboardInterrupt.  A second SIGINT within DEBOUNCE
    seconds of a KeyboardInterrupt is dropped too: it would only land in the
    middle of reporting the first one.
    """

    DEBOUNCE = 0.2

    def __init__(self):
        self.armed = False
        self.critical = 0
        self.pending = False
        self.main = threading.get_ident()
        self.shielded = set()
        self.last_raised = -1.0

    def shield(self, *functions):
        self.shielded.update(f.__code__ for f in functions)

    def handler(self, signum, frame):
        if not self.armed or (frame is not None and frame.f_code in self.shielded):
            return
        if self.critical:
            self.pending = True
            return
        self._raise()

    def _raise(self):
        now = time.monotonic()
        if now - self.last_raised < self.DEBOUNCE:
            return
        self.last_raised = now
        raise KeyboardInterrupt

    def enter(self):
        if threading.get_ident() == self.main:
            self.critical += 1

    def leave(self):
        if threading.get_ident() != self.main:
            return
        self.critical -= 1
        if not self.critical and self.pending:
            self.pending = False
            if self.armed:
                self._raise()

    def arm(self):
        self.pending = False
        self.armed = True

    def disarm(self):
        self.armed = False
        self.pending = False


INTR = Interrupts()


# --------------------------------------------------------------------------
# Event channel (fd 4)
# --------------------------------------------------------------------------

def _b64(data):
    import base64
    return base64.b64encode(bytes(data)).decode("ascii")


def _json_default(obj):
    if isinstance(obj, (bytes, bytearray, memoryview)):
        return _b64(obj)
    if isinstance(obj, (set, frozenset)):
        return list(obj)
    if hasattr(obj, "isoformat"):           # datetime, date, time
        return obj.isoformat()
    if hasattr(obj, "tolist"):              # numpy scalars and arrays
        return obj.tolist()
    return repr(obj)


def _json_clean(obj, depth=0):
    """Slow path for values json.dumps refuses (NaN, odd keys, cycles)."""
    if depth > 64:
        return repr(obj)
    if isinstance(obj, float):
        return obj if obj == obj and obj not in (float("inf"), float("-inf")) else repr(obj)
    if isinstance(obj, (str, int, bool)) or obj is None:
        return obj
    if isinstance(obj, dict):
        return {k if isinstance(k, str) else str(k): _json_clean(v, depth + 1)
                for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set, frozenset)):
        return [_json_clean(v, depth + 1) for v in obj]
    return _json_clean(_json_default(obj), depth + 1)


def _encode(event):
    try:
        text = json.dumps(event, ensure_ascii=False, separators=(",", ":"),
                          allow_nan=False, default=_json_default)
    except (TypeError, ValueError, RecursionError):
        text = json.dumps(_json_clean(event), ensure_ascii=False, separators=(",", ":"))
    try:
        return (text + "\n").encode("utf-8")
    except UnicodeEncodeError:
        # Lone surrogates (e.g. from os.fsdecode) cannot be UTF-8: pair what
        # can be paired, replace the rest with U+FFFD.
        fixed = text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
        return (fixed + "\n").encode("utf-8")


def _shrink(event, size):
    """Stand-in for an event too large for the agent to accept."""
    if event["type"] == "error":
        return dict(event, evalue=event["evalue"][:1 << 20],
                    traceback=[line[:1 << 16] for line in event["traceback"][-200:]])
    note = "sbx: %s of %.1f MiB not sent (limit: %d MiB per output)\n" % (
        event["type"], size / 1048576.0, MAX_EVENT_BYTES >> 20)
    return {"type": "stream", "id": event.get("id"), "name": "stderr", "text": note}


class Channel:
    """Serialises events onto fd 4; safe from any thread."""

    def __init__(self, fd):
        self.fd = fd
        self.lock = threading.Lock()
        self.request_id = None      # id stamped on every event
        self.enabled = True         # False in forked children

    def send(self, event, stamp=True):
        if not self.enabled:
            return
        if stamp:
            event["id"] = self.request_id
        data = _encode(event)
        if len(data) > MAX_EVENT_BYTES:
            data = _encode(_shrink(event, len(data)))
        self.send_raw(data)

    def send_raw(self, data):
        INTR.enter()
        try:
            with self.lock:
                view = memoryview(data)
                while view:
                    view = view[os.write(self.fd, view):]
        except BrokenPipeError:
            os._exit(0)             # the agent is gone
        finally:
            INTR.leave()

    def after_fork_child(self):
        self.lock = threading.Lock()
        self.enabled = False


# --------------------------------------------------------------------------
# sys.stdout / sys.stderr
# --------------------------------------------------------------------------

class OutputHub:
    """Buffers print() output of both streams and turns it into events.

    Flushing every write would make a million-line loop a million events;
    instead text is coalesced: a write containing a newline flushes at once
    unless the previous flush is younger than NEWLINE_GAP, 8 KiB flushes at
    once, and a daemon thread flushes whatever is left after FLUSH_INTERVAL,
    so a line is never held back longer than that while the cell computes.
    """

    def __init__(self, channel):
        self.channel = channel
        self.lock = threading.Lock()
        self.name = None
        self.parts = []
        self.size = 0
        self.last_flush = 0.0
        self.wake = threading.Event()
        self.thread = None
        self.passthrough = False    # forked child: write straight to fd 1/2

    def write(self, name, text):
        if self.passthrough:
            os.write(1 if name == "stdout" else 2, text.encode("utf-8", "replace"))
            return
        # The hot path of print(): keep it to a lock, an append and a compare.
        with self.lock:
            if self.parts and name != self.name:
                self._flush_locked()
            self.name = name
            self.parts.append(text)
            self.size += len(text)
            if self.size >= CHUNK_CHARS or (
                    "\n" in text and time.monotonic() - self.last_flush >= NEWLINE_GAP):
                self._flush_locked()
            elif len(self.parts) == 1:
                self._start_timer()

    def flush(self):
        if self.passthrough or not self.parts:
            return
        with self.lock:
            self._flush_locked()

    def _flush_locked(self):
        if not self.parts:
            return
        # Critical: a KeyboardInterrupt between taking the text out of the
        # buffer and writing it would silently drop output.
        INTR.enter()
        try:
            text = "".join(self.parts)
            self.parts = []
            self.size = 0
            self.last_flush = time.monotonic()
            for start in range(0, len(text), STREAM_EVENT_CHARS):
                self.channel.send({"type": "stream", "name": self.name,
                                   "text": text[start:start + STREAM_EVENT_CHARS]})
        finally:
            INTR.leave()

    def _start_timer(self):
        if self.thread is None:
            self.thread = threading.Thread(target=self._run, name="sbx-stream-flush", daemon=True)
            self.thread.start()
        if not self.wake.is_set():
            self.wake.set()

    def _run(self):
        while True:
            self.wake.wait()
            time.sleep(FLUSH_INTERVAL)
            with self.lock:
                self.wake.clear()
                try:
                    self._flush_locked()
                except Exception:   # keep the timer alive whatever happens
                    pass

    def before_fork(self):
        self.flush()

    def after_fork_child(self):
        self.lock = threading.Lock()
        self.parts = []
        self.size = 0
        self.thread = None
        self.wake = threading.Event()
        self.passthrough = True


class _BinaryStream(io.RawIOBase):
    """sys.stdout.buffer: bytes are decoded (UTF-8) and sent as text."""

    def __init__(self, text_stream):
        import codecs
        self._text = text_stream
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")

    def writable(self):
        return True

    def write(self, b):
        data = bytes(b)
        text = self._decoder.decode(data)
        if text:
            self._text.write(text)
        return len(data)

    def flush(self):
        self._text.flush()

    def fileno(self):
        return self._text.fileno()


class StreamWriter(io.TextIOBase):
    """Replacement for sys.stdout / sys.stderr that emits stream events.

    fileno() still answers the real fd 1/2, so code that needs a descriptor
    (faulthandler, subprocess with stdout=sys.stdout) writes to the agent's
    fd-level pipe, as on a terminal.
    """

    encoding = "utf-8"
    errors = "strict"
    line_buffering = False

    def __init__(self, hub, name, fd):
        self._hub = hub
        self._name = name
        self._fd = fd
        self._buffer = None

    @property
    def name(self):
        return "<%s>" % self._name

    @property
    def buffer(self):
        if self._buffer is None:
            self._buffer = _BinaryStream(self)
        return self._buffer

    def writable(self):
        return True

    def isatty(self):
        return False

    def fileno(self):
        return self._fd

    def write(self, s):
        if not isinstance(s, str):
            raise TypeError("write() argument must be str, not %s" % type(s).__name__)
        if s:
            self._hub.write(self._name, s)
        return len(s)

    def writelines(self, lines):
        for line in lines:
            self.write(line)

    def flush(self):
        self._hub.flush()

    def close(self):            # keep the stream usable: it is shared by all cells
        self.flush()


# --------------------------------------------------------------------------
# Import hooks (matplotlib integration, IPython display in stdlib mode)
# --------------------------------------------------------------------------

class _HookedLoader:
    """Wraps a real loader to run a callback right after the module executed."""

    def __init__(self, loader, callback):
        self._loader = loader
        self._callback = callback

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        # From here on everybody sees the real loader (importlib.resources...).
        module.__loader__ = self._loader
        if module.__spec__ is not None:
            module.__spec__.loader = self._loader
        self._loader.exec_module(module)
        try:
            self._callback(module)
        except Exception as e:  # never break the user's import
            sys.stderr.write("sbx: import hook for %s failed: %r\n" % (module.__name__, e))

    def __getattr__(self, name):
        return getattr(self._loader, name)


class _SyntheticLoader:
    def __init__(self, populate):
        self._populate = populate

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        self._populate(module.__dict__)


class ImportHooks:
    """sys.meta_path finder: post-import callbacks and synthetic modules.

    Costs one dict lookup per import; the driver itself never imports
    matplotlib (start-up stays fast), it just reacts when user code does.
    """

    def __init__(self):
        self.after = {}         # module name -> callback(module), one-shot
        self.synthetic = {}     # module name -> populate(namespace)

    def find_spec(self, fullname, path=None, target=None):
        populate = self.synthetic.get(fullname)
        if populate is not None:
            import importlib.machinery
            return importlib.machinery.ModuleSpec(fullname, _SyntheticLoader(populate))
        callback = self.after.get(fullname)
        if callback is None:
            return None
        spec = None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec = find(fullname, path, target)
            if spec is not None:
                break
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        del self.after[fullname]
        spec.loader = _HookedLoader(spec.loader, callback)
        return spec

    def on_import(self, name, callback):
        module = sys.modules.get(name)
        if module is not None:
            callback(module)
        else:
            self.after[name] = callback


HOOKS = ImportHooks()


def _want_inline_backend():
    """Inline figures unless MPLBACKEND explicitly names another backend."""
    want = os.environ.get("MPLBACKEND", "").strip().lower()
    return want in ("", "agg", "inline", INLINE_IPYTHON, INLINE_STDLIB)


def _is_empty_figure(fig):
    # IPython's print_figure() criterion: no axes and no lines -> no image.
    return not getattr(fig, "axes", True) and not getattr(fig, "lines", True)


def _print_figure_png(fig):
    """PNG of a figure exactly as IPython.core.pylabtools.print_figure does."""
    if _is_empty_figure(fig):
        return None
    buf = io.BytesIO()
    if fig.canvas is None:
        from matplotlib.backend_bases import FigureCanvasBase
        FigureCanvasBase(fig)
    fig.canvas.print_figure(buf, format="png", facecolor=fig.get_facecolor(),
                            edgecolor=fig.get_edgecolor(), dpi=fig.dpi, bbox_inches="tight")
    return buf.getvalue()


def flush_agg_figures(publish):
    """Figures a cell left open under the plain Agg backend, published as
    image/png and closed.  A cell that calls matplotlib.use("Agg") (common in
    scripts written for headless machines) leaves the inline backend, which
    would otherwise show nothing; the Cloudflare SDK's executor captures open
    figures whatever the backend, and so do we.  publish(bundle, fig) emits
    one display_data."""
    mpl = sys.modules.get("matplotlib")
    pyplot = sys.modules.get("matplotlib.pyplot")
    if mpl is None or pyplot is None:
        return
    try:
        if str(mpl.get_backend()).lower() != "agg":
            return
        nums = pyplot.get_fignums()
        for num in nums:
            fig = pyplot.figure(num)
            png = _print_figure_png(fig)
            if png:
                publish({"image/png": png, "text/plain": repr(fig)}, fig)
        if nums:
            pyplot.close("all")
    except Exception:       # a broken figure must not break the cell's result
        pass


# --------------------------------------------------------------------------
# Charts: what a matplotlib figure shows, as data (the SDK's ChartData)
# --------------------------------------------------------------------------

CHART_POINTS = 10000        # values kept per series (the rest: "truncated": true)


def _chart_value(v):
    """A JSON value for one data point: a number (integral ones as int), a
    category's string, None for NaN/inf/masked."""
    if isinstance(v, str):
        return v
    try:
        f = float(v)
    except (TypeError, ValueError):
        return _safe_str(v)
    if f != f or f in (float("inf"), float("-inf")):
        return None
    return int(f) if f.is_integer() and abs(f) < 2 ** 53 else f


def _chart_values(values):
    values = list(values)
    return [_chart_value(v) for v in values[:CHART_POINTS]], len(values) > CHART_POINTS


def _chart_label(artist):
    label = artist.get_label()
    return None if not label or label.startswith("_") else str(label)


def _category_names(axis):
    """{position: name} of a categorical axis (bar charts of strings)."""
    units = getattr(axis, "units", None)
    mapping = getattr(units, "_mapping", None)
    return {float(v): str(k) for k, v in mapping.items()} if mapping else {}


def _series(label, **columns):
    out = {"label": label}
    for name, values in columns.items():
        out[name], cut = _chart_values(values)
        if cut:
            out["truncated"] = True
    return out


def _axes_chart(ax):
    """(type, data) of one Axes, by what it draws: pie wedges, an image or
    mesh (heatmap), bars (histogram when they touch), scatter points, lines."""
    from matplotlib.collections import PathCollection, QuadMesh
    from matplotlib.container import BarContainer
    from matplotlib.patches import Wedge
    wedges = [p for p in ax.patches if isinstance(p, Wedge)]
    if wedges:
        return "pie", [{"label": _chart_label(w), "value": _chart_value((w.theta2 - w.theta1) / 360.0)}
                       for w in wedges]
    meshes = [m for m in ax.collections if isinstance(m, QuadMesh)]
    grids = [im.get_array() for im in ax.get_images()] + [m.get_array() for m in meshes]
    if grids:
        data = []
        for g in grids:
            rows = g.tolist() if hasattr(g, "tolist") else list(g)
            if rows and not isinstance(rows[0], list):
                rows = [rows]
            cut = sum(len(r) for r in rows) > CHART_POINTS
            data.append({"values": None if cut else [[_chart_value(v) for v in r] for r in rows],
                         **({"truncated": True} if cut else {})})
        return "heatmap", data
    bars = [c for c in ax.containers if isinstance(c, BarContainer) and len(c)]
    if bars:
        data, touching = [], True
        for c in bars:
            horizontal = getattr(c, "orientation", "vertical") == "horizontal"
            names = _category_names(ax.yaxis if horizontal else ax.xaxis)
            pos, size, height = [], [], []
            for r in c:
                if horizontal:
                    pos.append(r.get_y() + r.get_height() / 2.0)
                    size.append(r.get_height())
                    height.append(r.get_width())
                else:
                    pos.append(r.get_x() + r.get_width() / 2.0)
                    size.append(r.get_width())
                    height.append(r.get_height())
            touching = touching and not names and len(pos) > 1 and all(
                abs((pos[i + 1] - size[i + 1] / 2.0) - (pos[i] + size[i] / 2.0)) <= 1e-9 * max(1.0, abs(pos[i]))
                for i in range(len(pos) - 1))
            data.append(_series(_chart_label(c), x=[names.get(float(p), p) for p in pos], y=height))
        if touching:        # adjacent bars: a histogram; x are the bins' edges
            for series, c in zip(data, bars):
                edges = [r.get_x() for r in c] + [c[-1].get_x() + c[-1].get_width()]
                series["x"], _ = _chart_values(edges)
            return "histogram", data
        return "bar", data
    points = [col for col in ax.collections if isinstance(col, PathCollection)]
    lines = [ln for ln in ax.get_lines() if ln.get_visible() and len(ln.get_xdata())]
    if points and not lines:
        return "scatter", [_series(_chart_label(p), x=[o[0] for o in p.get_offsets()],
                                   y=[o[1] for o in p.get_offsets()]) for p in points]
    if lines:
        return "line", [_series(_chart_label(ln), x=ln.get_xdata(), y=ln.get_ydata()) for ln in lines]
    return "unknown", []


def _axes_layout(ax):
    return {"xLabel": ax.get_xlabel(), "yLabel": ax.get_ylabel(),
            "xScale": ax.get_xscale(), "yScale": ax.get_yscale()}


def figure_chart(fig):
    """The SDK's ChartData for a matplotlib figure that was just drawn:
    {type, title, data, layout, library: "matplotlib"}; a figure of several
    axes has type "unknown" (or their common type) and one entry per axes in
    data, each {type, title, data, layout}.  None if it has no axes or
    anything fails (a chart never costs the figure its image)."""
    try:
        axes = [ax for ax in fig.get_axes() if ax.get_visible()
                and not getattr(ax, "_colorbar", None) and ax.get_label() != "<colorbar>"]
        if not axes:
            return None
        parts = []
        for ax in axes:
            kind, data = _axes_chart(ax)
            part = {"type": kind, "data": data, "layout": _axes_layout(ax)}
            if ax.get_title():
                part["title"] = ax.get_title()
            parts.append(part)
        suptitle = getattr(fig, "_suptitle", None)
        title = suptitle.get_text() if suptitle is not None else None
        if len(parts) == 1:
            chart = parts[0]
        else:
            kinds = {p["type"] for p in parts}
            chart = {"type": kinds.pop() if len(kinds) == 1 else "unknown",
                     "data": parts, "layout": {"axes": len(parts)}}
        if title and "title" not in chart:
            chart["title"] = title
        chart["library"] = "matplotlib"
        return chart
    except Exception:   # noqa: BLE001
        return None


def _is_figure(obj):
    figure = sys.modules.get("matplotlib.figure")
    return figure is not None and isinstance(obj, figure.Figure)


def chart_of(obj, data):
    """The chart of a displayed object: a matplotlib figure shown as PNG."""
    if obj is None or "image/png" not in data or not _is_figure(obj):
        return None
    return figure_chart(obj)


# --------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------

def _is_driver_frame(tb):
    filename = tb.tb_frame.f_code.co_filename
    if filename == _THIS_FILE:
        return True
    asyncio = sys.modules.get("asyncio")
    return asyncio is not None and filename.startswith(os.path.dirname(asyncio.__file__))


def strip_driver_frames(tb):
    """Drop the driver's (and the event loop's) frames around user code.

    Leading frames are the driver calling exec/run_until_complete; a
    trailing frame is the SIGINT handler that raised KeyboardInterrupt.
    Traceback objects are linked lists with a writable tb_next (3.7+).
    """
    head = tb
    while head is not None and _is_driver_frame(head):
        head = head.tb_next
    if head is None:            # raised by the driver itself: no user frames
        return None
    node = head
    while node.tb_next is not None:
        if node.tb_next.tb_frame.f_code.co_filename == _THIS_FILE:
            node.tb_next = None
            break
        node = node.tb_next
    return head


def _safe_str(obj):
    try:
        return str(obj)
    except Exception:
        return "<unprintable %s object>" % type(obj).__name__


def _split_lines(chunks):
    lines = []
    for chunk in chunks:
        lines.extend(chunk.rstrip("\n").split("\n"))
    return lines


def stdlib_error_event(exc, exception_only=False):
    import traceback
    etype = type(exc)
    if exception_only or isinstance(exc, SyntaxError):
        chunks = traceback.format_exception_only(etype, exc)
    else:
        tb = strip_driver_frames(exc.__traceback__)
        chunks = traceback.format_exception(etype, exc, tb)
    return {"type": "error", "ename": etype.__name__, "evalue": _safe_str(exc),
            "traceback": _split_lines(chunks)}


_ANSI = None


def strip_ansi(text):
    global _ANSI
    if _ANSI is None:
        import re
        _ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
    return _ANSI.sub("", text)


# --------------------------------------------------------------------------
# Mime bundles
# --------------------------------------------------------------------------

def encode_bundle(data):
    """bytes values (image/png, image/jpeg, application/pdf...) -> base64."""
    return {str(k): (_b64(v) if isinstance(v, (bytes, bytearray, memoryview)) else v)
            for k, v in data.items()}


# (mime, method, accepted return types) in IPython's formatter order.
_REPR_METHODS = (
    ("text/html", "_repr_html_", (str,)),
    ("text/markdown", "_repr_markdown_", (str,)),
    ("image/svg+xml", "_repr_svg_", (str,)),
    ("image/png", "_repr_png_", (bytes, str)),
    ("application/pdf", "_repr_pdf_", (bytes, str)),
    ("image/jpeg", "_repr_jpeg_", (bytes, str)),
    ("text/latex", "_repr_latex_", (str,)),
    ("application/json", "_repr_json_", (list, dict)),
    ("application/javascript", "_repr_javascript_", (str,)),
)


def _real_method(obj, name):
    """IPython's get_real_method: no proxies that claim every attribute,
    no instance methods looked up on classes."""
    try:
        if getattr(obj, "_ipython_canary_method_should_not_exist_", None) is not None:
            return None
        method = getattr(obj, name, None)
    except Exception:
        return None
    if isinstance(obj, type) and not isinstance(method, types.MethodType):
        return None
    return method if callable(method) else None


class StdlibFormatter:
    """IPython's DisplayFormatter.format() rules without IPython.

    Formatter failures are reported as error events (IPython shows them
    through showtraceback too) and the mime type is skipped.
    """

    def __init__(self, report_error):
        self.report_error = report_error

    def _call(self, fn, *args, **kwargs):
        try:
            return fn(*args, **kwargs), True
        except NotImplementedError:
            return None, False
        except Exception as e:
            self.report_error(e)
            return None, False

    def _checked(self, mime, value, types_):
        if value is None:
            return None, None
        md = None
        if isinstance(value, tuple) and len(value) == 2:
            value, md = value
        if not isinstance(value, types_):
            import warnings
            warnings.warn("%s formatter returned invalid type %s (expected %s)"
                          % (mime, type(value), types_))
            return None, None
        return value, md

    def format(self, obj, include=None, exclude=None):
        """Return (data, metadata); ({}, {}) if the object displayed itself."""
        own = _real_method(obj, "_ipython_display_")
        if own is not None:
            self._call(own)
            return {}, {}
        data, metadata = {}, {}
        bundle_fn = _real_method(obj, "_repr_mimebundle_")
        if bundle_fn is not None:
            value, _ = self._call(bundle_fn, include=include, exclude=exclude)
            if isinstance(value, tuple) and len(value) == 2:
                value, md = value
                metadata.update(md or {})
            if isinstance(value, dict):
                data.update((k, v) for k, v in value.items()
                            if (not include or k in include) and not (exclude and k in exclude))

        def wanted(mime):
            return (mime not in data and (not include or mime in include)
                    and not (exclude and mime in exclude))

        if wanted("text/plain"):
            text = self._plain(obj)
            if text is not None:
                data["text/plain"] = text
        for mime, name, types_ in _REPR_METHODS:
            if not wanted(mime):
                continue
            if mime == "image/png" and self._is_figure(obj):
                value, _ = self._call(_print_figure_png, obj)
            else:
                method = _real_method(obj, name)
                if method is None:
                    continue
                value, _ = self._call(method)
            value, md = self._checked(mime, value, types_)
            if value is not None:
                data[mime] = value
            if md is not None:
                metadata[mime] = md
        return data, metadata

    _is_figure = staticmethod(_is_figure)

    def _plain(self, obj):
        text, ok = self._call(repr, obj)
        if not ok:
            return None
        if len(text) > 79 and type(obj) in (dict, list, tuple, set, frozenset) and len(obj) <= 1000:
            import pprint
            pretty, ok = self._call(pprint.pformat, obj, width=79, sort_dicts=False)
            if ok:
                text = pretty
        return text


# --------------------------------------------------------------------------
# Runners: one per mode.  run(code) -> status; they emit their own events.
# --------------------------------------------------------------------------

class BaseRunner:
    def __init__(self, channel, hub):
        self.channel = channel
        self.hub = hub
        self.loop = None

    def warm_up(self):
        """Work every context's first cell would do, done once by a fork
        server before it forks (nothing is sent: there is no channel)."""

    errors_emitted = 0
    last_exception = None       # what made the last cell fail, if known

    def emit(self, event):
        self.hub.flush()        # stream text first: keep output ordered
        self.channel.send(event)
        if event["type"] == "error":
            self.errors_emitted += 1

    def event_loop(self):
        """The context's persistent asyncio loop, also asyncio's current one."""
        import asyncio
        import warnings
        if self.loop is None or self.loop.is_closed():
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)
                loop = asyncio.get_event_loop_policy().get_event_loop()
            if loop.is_closed() or loop.is_running():
                loop = asyncio.new_event_loop()
            self.loop = loop
        asyncio.set_event_loop(self.loop)
        return self.loop

    def run_coroutine(self, coro, on_interrupt):
        """Run a cell coroutine to completion on the persistent loop.

        SIGINT while the cell awaits lands in the loop's select(), outside
        the cell: cancel the cell's task so that the cancellation surfaces
        at the user's `await` (on_interrupt() lets the caller report it as
        KeyboardInterrupt), instead of leaving a half-run task behind.
        """
        loop = self.event_loop()
        task = loop.create_task(coro)
        while True:
            try:
                return loop.run_until_complete(task)
            except KeyboardInterrupt:
                if task.done():
                    raise
                on_interrupt()
                task.cancel()


class StdlibRunner(BaseRunner):
    mode = "stdlib"

    def __init__(self, channel, hub):
        super().__init__(channel, hub)
        import codeop
        import ast
        self.ast = ast
        self.compiler = codeop.Compile()        # remembers __future__ imports
        self.compiler.flags |= ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
        self.execution_count = 0
        self.formatter = StdlibFormatter(self.report_error)
        self.module = types.ModuleType("__main__")
        self.module.__dict__["__builtins__"] = builtins
        self.ns = self.module.__dict__
        sys.modules["__main__"] = self.module
        builtins.display = self.display
        self.inline = None      # the synthetic matplotlib backend, once loaded
        HOOKS.on_import("matplotlib", self._on_matplotlib)
        HOOKS.on_import("IPython.core.display_functions", self._on_ipython_display)

    # -- display machinery ------------------------------------------------

    def report_error(self, exc):
        self.emit(stdlib_error_event(exc))

    def publish(self, data, metadata=None, transient=None, update=False, chart=None):
        event = {"type": "update_display_data" if update else "display_data",
                 "data": encode_bundle(data), "metadata": metadata or {}}
        if transient:
            event["transient"] = transient
        if chart:
            event["chart"] = chart
        self.emit(event)

    def clear_output(self, wait=False):
        self.emit({"type": "clear_output", "wait": bool(wait)})

    def display(self, *objs, include=None, exclude=None, metadata=None, transient=None,
                display_id=None, raw=False, clear=False, update=False, **kwargs):
        """IPython.display.display() for the stdlib mode (same signature)."""
        if clear:
            self.clear_output(wait=True)
        transient = dict(transient or {})
        if display_id:
            if display_id is True:
                display_id = os.urandom(16).hex()
            transient["display_id"] = display_id
        if update and "display_id" not in transient:
            raise TypeError("display_id required for update_display")
        for obj in objs:
            if raw:
                self.publish(obj, metadata, transient, update)
                continue
            data, md = self.formatter.format(obj, include=include, exclude=exclude)
            if not data:
                continue
            if metadata:
                md.update(metadata)
            self.publish(data, md, transient, update, chart_of(obj, data))
        if display_id:
            return _DisplayHandle(self, display_id)
        return None

    def _on_ipython_display(self, module):
        # IPython is importable but not running: route its display functions
        # (and everything built on them: DisplayHandle...) to the protocol.
        runner = self
        module.display = self.display

        def update_display(obj, *, display_id, **kwargs):
            kwargs["update"] = True
            runner.display(obj, display_id=display_id, **kwargs)

        def publish_display_data(data, metadata=None, source=None, *, transient=None, **kwargs):
            runner.publish(data, metadata, transient, kwargs.get("update", False))

        module.update_display = update_display
        module.publish_display_data = publish_display_data
        module.clear_output = self.clear_output

    # -- matplotlib -----------------------------------------------------------

    def _on_matplotlib(self, mpl):
        if not _want_inline_backend():
            return
        HOOKS.synthetic["_sbx_mpl_inline"] = self._populate_inline_backend
        mpl.interactive(True)           # as IPython's activate_matplotlib
        mpl.rcParams["backend"] = INLINE_STDLIB

    def _populate_inline_backend(self, ns):
        """A matplotlib backend module mirroring matplotlib_inline's."""
        import matplotlib
        from matplotlib._pylab_helpers import Gcf
        from matplotlib.backends import backend_agg
        from matplotlib.figure import Figure
        runner = self
        state = {"draw_called": False}

        def display_figure(fig):
            if not _is_empty_figure(fig):
                runner.display(fig)

        def new_figure_manager(num, *args, FigureClass=Figure, **kwargs):
            return new_figure_manager_given_figure(num, FigureClass(*args, **kwargs))

        def new_figure_manager_given_figure(num, figure):
            manager = backend_agg.new_figure_manager_given_figure(num, figure)
            if matplotlib.is_interactive():
                state["draw_called"] = True
            return manager

        def show(close=None, block=None):
            try:
                for manager in Gcf.get_all_fig_managers():
                    display_figure(manager.canvas.figure)
            finally:
                if close is not False and Gcf.get_all_fig_managers():
                    matplotlib.pyplot.close("all")

        def flush_figures():
            """Display and close the cell's figures (a post-execute step)."""
            if not state["draw_called"]:
                return
            try:
                show(True)
            finally:
                state["draw_called"] = False

        ns.update(FigureCanvas=backend_agg.FigureCanvasAgg, new_figure_manager=new_figure_manager,
                  new_figure_manager_given_figure=new_figure_manager_given_figure,
                  show=show, flush_figures=flush_figures)
        self.inline = ns

    def post_execute(self):
        if self.inline is not None:
            try:
                self.inline["flush_figures"]()
            except Exception as e:
                self.report_error(e)
        flush_agg_figures(lambda bundle, fig: self.publish(bundle, chart=chart_of(fig, bundle)))

    # -- cells --------------------------------------------------------------

    @property
    def cell_count(self):
        return self.execution_count

    def run(self, code):
        self.execution_count += 1
        filename = "<cell-%d>" % self.execution_count
        self._register_source(filename, code)
        try:
            try:
                body, last = self._compile(code, filename)
            except (SyntaxError, ValueError, OverflowError) as e:
                self.emit(stdlib_error_event(e, exception_only=True))
                return "error"
            try:
                value = self._execute(body, last)
                if value is not None and not _ends_with_semicolon(code):
                    self._display_result(value)
            except SystemExit as e:     # reported, never obeyed
                self.emit(stdlib_error_event(e, exception_only=True))
                return "error"
            except BaseException as e:  # noqa: B902 - the cell's failure, whatever it is
                self.emit(stdlib_error_event(e))
                return "error"
            return "ok"
        finally:
            self.post_execute()

    def _register_source(self, filename, code):
        import linecache
        # mtime None: linecache.checkcache() keeps the entry (no file behind it).
        linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)

    def _compile(self, code, filename):
        """(body, last expression or None), as IPython's 'last_expr' mode."""
        ast = self.ast
        flags = ast.PyCF_ONLY_AST | self.compiler.flags
        try:
            tree = compile(code, filename, "exec", flags, True)
        except SyntaxError:
            # Notebook-style code often starts with `%matplotlib inline`,
            # which is this mode's default anyway: blank such lines (keeping
            # line numbers) and retry; any other error stands.
            import re
            bare = re.sub(r"(?m)^[ \t]*%matplotlib\b[^\n]*$", "", code)
            if bare == code:
                raise
            tree = compile(bare, filename, "exec", flags, True)
        last = None
        if tree.body and isinstance(tree.body[-1], ast.Expr):
            last = ast.Expression(tree.body.pop().value)
        body = self.compiler(tree, filename, "exec")
        return body, (self.compiler(last, filename, "eval") if last is not None else None)

    def _execute(self, body, last):
        """Run the cell; return the last expression's value (or None)."""
        import inspect
        codes = (body,) if last is None else (body, last)
        if not any(c.co_flags & inspect.CO_COROUTINE for c in codes):
            value = None
            for c in codes:
                value = eval(c, self.ns)
            return value
        # Any `await`: the whole cell runs inside the loop, as in IPython, so
        # that e.g. asyncio.get_running_loop() works in every statement.
        return self._await(self._execute_async(codes))

    async def _execute_async(self, codes):
        import inspect
        value = None
        for c in codes:
            value = eval(c, self.ns)
            if c.co_flags & inspect.CO_COROUTINE:
                value = await value
        return value

    def _await(self, coro):
        interrupted = []
        try:
            return self.run_coroutine(coro, lambda: interrupted.append(True))
        except BaseException as e:
            import asyncio
            if interrupted and isinstance(e, asyncio.CancelledError):
                # Our own cancellation after a SIGINT: report it as the
                # KeyboardInterrupt it was, pointing at the user's await.
                raise KeyboardInterrupt().with_traceback(e.__traceback__) from None
            raise

    def _display_result(self, value):
        self.ns["_"] = value
        data, md = self.formatter.format(value)
        if not data:
            return      # _ipython_display_ displayed it already
        if "text/plain" not in data:
            data["text/plain"] = object.__repr__(value)
        event = {"type": "execute_result", "execution_count": self.execution_count,
                 "data": encode_bundle(data), "metadata": md}
        chart = chart_of(value, data)
        if chart:
            event["chart"] = chart
        self.emit(event)


class _DisplayHandle:
    """Minimal IPython.display.DisplayHandle for the stdlib mode."""

    def __init__(self, runner, display_id):
        self._runner = runner
        self.display_id = display_id

    def __repr__(self):
        return "<DisplayHandle display_id=%s>" % self.display_id

    def display(self, obj, **kwargs):
        self._runner.display(obj, display_id=self.display_id, **kwargs)

    def update(self, obj, **kwargs):
        self._runner.display(obj, display_id=self.display_id, update=True, **kwargs)


def _ends_with_semicolon(code):
    """IPython's DisplayHook.quiet(): is the last real token a ';'?"""
    import tokenize
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(code).readline))
    except (tokenize.TokenError, SyntaxError):
        return False
    skip = (tokenize.ENDMARKER, tokenize.NL, tokenize.NEWLINE, tokenize.COMMENT)
    for tok in reversed(tokens):
        if tok.type in skip:
            continue
        return tok.type == tokenize.OP and tok.string == ";"
    return False


class _DeferredModule(types.ModuleType):
    """Stands in for a module until one of its attributes is needed.

    The first attribute access imports the real module (which then replaces
    this one in sys.modules and on its parent package) and delegates to it.
    """

    def __getattr__(self, attr):
        if attr.startswith("__"):
            # The import system probes __path__ & co.: not a reason to load.
            raise AttributeError(attr)
        name = self.__name__
        if sys.modules.get(name) is self:
            del sys.modules[name]
        import importlib
        return getattr(importlib.import_module(name), attr)


class _HiddenModule:
    """`with _HiddenModule("jedi"):` makes `import jedi` fail inside the block
    (unless jedi is already loaded); afterwards it imports normally again."""

    def __init__(self, name):
        self.name = name
        self.hidden = False

    def __enter__(self):
        if self.name not in sys.modules:
            sys.modules[self.name] = None
            self.hidden = True
        return self

    def __exit__(self, *exc):
        if self.hidden and sys.modules.get(self.name, 0) is None:
            del sys.modules[self.name]


def _import_ipython():
    """Import IPython and return InteractiveShell, skipping the terminal UI.

    IPython/__init__ does `from .terminal.embed import embed`, which loads
    prompt_toolkit and the terminal shell (~60 ms) that a kernel never uses.
    IPython.terminal.embed is deferred until something touches it, and
    IPython.embed is a thin wrapper that loads it on first call.
    """
    name = "IPython.terminal.embed"
    deferred = None
    if name not in sys.modules:
        deferred = _DeferredModule(name)

        def embed(**kwargs):
            return deferred.__getattr__("embed")(**kwargs)

        embed.__module__, embed.__doc__ = name, "IPython.embed(); loads the terminal UI first."
        deferred.embed = embed
        sys.modules[name] = deferred
    import IPython  # noqa: F401
    from IPython.core.interactiveshell import InteractiveShell
    if deferred is not None and sys.modules.get("IPython.terminal") is not None:
        # `import IPython.terminal.embed as m` reads the package attribute.
        sys.modules["IPython.terminal"].embed = deferred
    return InteractiveShell


class IPythonRunner(BaseRunner):
    """An InteractiveShell with ipykernel's three output overrides
    (displayhook, display publisher, _showtraceback) aimed at fd 4."""

    mode = "ipython"

    def __init__(self, channel, hub, InteractiveShell):
        super().__init__(channel, hub)
        from traitlets import Type
        from traitlets.config import Config
        from IPython.core.displayhook import DisplayHook
        from IPython.core.displaypub import DisplayPublisher

        runner = self

        class SbxDisplayHook(DisplayHook):
            """execute_result instead of 'Out[n]:' on stdout."""

            def start_displayhook(self):
                self._bundle = None

            def write_output_prompt(self):
                pass

            def write_format_data(self, format_dict, md_dict=None):
                self._bundle = (format_dict, md_dict)

            def finish_displayhook(self):
                chart = runner.take_chart(self._bundle[0] if self._bundle else {})
                if self._bundle and self._bundle[0]:
                    data, md = self._bundle
                    event = {"type": "execute_result", "execution_count": self.prompt_count,
                             "data": encode_bundle(data), "metadata": md or {}}
                    if chart:
                        event["chart"] = chart
                    runner.emit(event)
                self._bundle = None

        class SbxDisplayPublisher(DisplayPublisher):
            def publish(self, data, metadata=None, source=None, *, transient=None,
                        update=False, **kwargs):
                self._validate_data(data, metadata)
                event = {"type": "update_display_data" if update else "display_data",
                         "data": encode_bundle(data), "metadata": metadata or {}}
                if transient:
                    event["transient"] = transient
                chart = runner.take_chart(data)
                if chart:
                    event["chart"] = chart
                runner.emit(event)

            def clear_output(self, wait=False):
                runner.emit({"type": "clear_output", "wait": bool(wait)})

        class SbxShell(InteractiveShell):
            displayhook_class = Type(SbxDisplayHook)
            display_pub_class = Type(SbxDisplayPublisher)

            def init_virtualenv(self):      # as ipykernel: no venv guessing
                pass

            def enable_gui(self, gui=None):
                # `%matplotlib inline` lands here with gui=None, as in
                # ipykernel; there is no GUI event loop in a sandbox.
                if gui not in (None, "inline"):
                    from IPython.core.error import UsageError
                    raise UsageError("GUI event loop %r is not available in a sandbox; "
                                     "use the inline backend" % (gui,))
                self.active_eventloop = gui

            def ask_exit(self):
                # exit()/quit(): ipykernel would shut the kernel down; a
                # context ends when the agent deletes it, so only record it.
                self.exit_now = True

            def _showtraceback(self, etype, evalue, stb):
                runner.emit({"type": "error", "ename": etype.__name__,
                             "evalue": _safe_str(evalue),
                             "traceback": [strip_ansi(s) for s in stb]})

            def showtraceback(self, exc_tuple=None, *args, **kwargs):
                try:
                    exc_tuple = runner.fix_exc_info(self._get_exc_info(exc_tuple))
                except ValueError:
                    pass
                return super().showtraceback(exc_tuple, *args, **kwargs)

        for cls in (SbxDisplayHook, SbxDisplayPublisher, SbxShell):   # readable reprs
            cls.__module__, cls.__qualname__ = "sbx", cls.__name__
        config = Config()
        config.HistoryManager.enabled = False      # no sqlite file in $HOME
        config.InteractiveShell.colors = "NoColor"
        self.interrupted_await = False
        self.shell = SbxShell.instance(config=config)
        self.shell.loop_runner = self._loop_runner
        self.shell.set_hook("show_in_pager", self._page, 99)
        # display() and the displayhook format an object, then publish its
        # bundle: remember the object in between, for take_chart().
        self.formatted = None
        real_format = self.shell.display_formatter.format

        def format_and_remember(obj, include=None, exclude=None):
            result = real_format(obj, include=include, exclude=exclude)
            runner.formatted = obj
            return result

        self.shell.display_formatter.format = format_and_remember
        HOOKS.on_import("matplotlib", self._on_matplotlib)
        HOOKS.on_import("matplotlib_inline.backend_inline", self._on_inline_backend)

    @property
    def cell_count(self):
        """execution_count of the cell that ran last (IPython has moved on)."""
        return self.shell.execution_count - 1

    def take_chart(self, data):
        """The chart of the object formatted into `data` (see chart_of)."""
        obj, self.formatted = self.formatted, None
        return chart_of(obj, data)

    def fix_exc_info(self, exc_tuple):
        etype, value, tb = exc_tuple
        if self.interrupted_await:
            import asyncio
            if issubclass(etype, asyncio.CancelledError):
                # The cancellation run_coroutine() did after a SIGINT.
                value = KeyboardInterrupt().with_traceback(tb)
                etype = KeyboardInterrupt
        return etype, value, strip_driver_frames(tb) if tb is not None else tb

    def _loop_runner(self, coro):
        def interrupted():
            self.interrupted_await = True
        return self.run_coroutine(coro, interrupted)

    @staticmethod
    def _page(shell, data, start=0, screen_lines=0, pager_cmd=None):
        # `obj?` and friends: print instead of starting a pager (ipykernel
        # sends a payload the frontend shows; stdout is our equivalent).
        text = data.get("text/plain", "") if isinstance(data, dict) else str(data)
        print(strip_ansi(text))

    def _on_matplotlib(self, mpl):
        if _want_inline_backend():
            # What ipykernel does through MPLBACKEND, without exporting the
            # variable to the user's subprocesses.
            mpl.rcParams["backend"] = INLINE_IPYTHON

    @staticmethod
    def _on_inline_backend(module):
        real_display = module.display

        def display(fig, *args, **kwargs):
            if not _is_empty_figure(fig):
                return real_display(fig, *args, **kwargs)
            return None

        module.display = display    # used by its show() and flush_figures()

    def warm_up(self):
        """IPython's first run_cell imports and builds its input transformers,
        compiler and AST machinery (~70 ms, in every fork if not here): run
        a silent cell that leaves no trace (no history, no execution count,
        no output, `_` untouched)."""
        emit, self.emit = self.emit, lambda event: None
        try:
            self.shell.run_cell("(lambda: 1)()", store_history=False, silent=True)
            self.shell.display_formatter.format({"warm": [1.5, "up"]})
        except Exception:   # noqa: BLE001 - a cold first cell is only slower
            pass
        finally:
            self.emit = emit
            self.formatted = None

    def run(self, code):
        self.interrupted_await = False
        result = self.shell.run_cell(code, store_history=True, silent=False)
        self.last_exception = result.error_before_exec or result.error_in_exec
        def publish(bundle, fig):
            self.formatted = fig
            self.shell.display_pub.publish(bundle)
        flush_agg_figures(publish)
        return "ok" if result.success else "error"


# --------------------------------------------------------------------------
# Main loop
# --------------------------------------------------------------------------

class Driver:
    def __init__(self):
        self.pid = os.getpid()
        self.channel = Channel(EV_FD)
        self.hub = OutputHub(self.channel)
        self.runner = None

    def start(self):
        self.prepare()
        self.go_live()

    def prepare(self):
        """What every context needs and no context owns: the runner (IPython
        imported, its shell built) and the import hooks.  A fork server does
        this once; its forks only go_live()."""
        signal.signal(signal.SIGINT, INTR.handler)
        if sys.path and sys.path[0] == os.path.dirname(os.path.abspath(_THIS_FILE)):
            # Imports resolve from the context's cwd (as in the REPL), not
            # from the driver's installation directory.
            sys.path[0] = ""
        self.runner = self._make_runner()
        sys.meta_path.insert(0, HOOKS)

    def go_live(self):
        """Take fd 3/4 and 1/2 as this context's and say ready."""
        self.pid = os.getpid()
        try:
            for fd in (REQ_FD, EV_FD):
                os.set_inheritable(fd, False)   # never leak the protocol to children
        except OSError:
            sys.exit("driver.py: fd 3 (requests) and fd 4 (events) must be open pipes; "
                     "see the protocol in this file's header")
        sys.stdout = StreamWriter(self.hub, "stdout", 1)
        sys.stderr = StreamWriter(self.hub, "stderr", 2)
        os.register_at_fork(before=self.hub.before_fork, after_in_child=self._after_fork_child)
        self.channel.send({"type": "ready", "pid": self.pid, "language": "python",
                           "mode": self.runner.mode, "version": _version()}, stamp=False)

    def _make_runner(self):
        mode = os.environ.get("SBX_PY_MODE", "").strip().lower()
        if mode != "stdlib":
            # IPython imports jedi (~100 ms, a third of the start-up) only to
            # offer completions, which this protocol has no request for:
            # hidden, IPython uses its own completer; user code can still
            # import jedi later.
            try:
                with _HiddenModule("jedi"):
                    return IPythonRunner(self.channel, self.hub, _import_ipython())
            except Exception as e:
                if mode == "ipython":
                    os.write(2, ("sbx: IPython unavailable (%r), using stdlib mode\n" % e).encode())
        return StdlibRunner(self.channel, self.hub)

    def _after_fork_child(self):
        self.channel.after_fork_child()
        self.hub.after_fork_child()
        for fd in (REQ_FD, EV_FD):
            try:
                os.close(fd)
            except OSError:
                pass

    def serve(self):
        requests = open(REQ_FD, "rb", buffering=1 << 16, closefd=False)
        while True:
            line = requests.readline()
            if not line:
                break
            if line.strip():
                try:
                    self.handle_line(line)
                except KeyboardInterrupt:   # belt and braces: never die of SIGINT
                    pass
            if os.getpid() != self.pid:     # a fork that fell out of a cell
                os._exit(0)
        self.exit()

    def handle_line(self, line):
        try:
            request = json.loads(line)
            if not isinstance(request, dict):
                raise ValueError("request is not an object")
        except ValueError as e:
            os.write(2, ("sbx: bad request line: %s\n" % e).encode())
            return
        self.channel.request_id = request.get("id")
        kind = request.get("type")
        if kind == "execute":
            self.execute(request.get("code") or "")
        elif kind == "init":
            self.init(request)
        else:
            self.channel.send({"type": "error", "ename": "ValueError",
                               "evalue": "unknown request type %r" % (kind,), "traceback": []})
            self.channel.send({"type": "done", "status": "error"})

    def execute(self, code):
        # This frame is shielded (see Interrupts): no KeyboardInterrupt can be
        # raised here, only inside runner.run(), so `done` is always sent.
        status, failure = "error", None
        errors_before = self.runner.errors_emitted
        INTR.arm()
        try:
            status = self.runner.run(code)
        except BaseException as e:  # noqa: B902 - whatever escapes, the context lives on
            failure = e
        INTR.disarm()
        if signal.getsignal(signal.SIGINT) != INTR.handler:
            # The cell installed its own SIGINT handler; ipykernel also
            # restores its own after every cell.  Idle SIGINTs must not kill.
            signal.signal(signal.SIGINT, INTR.handler)
        if failure is not None or (status == "error" and self.runner.errors_emitted == errors_before):
            # Escaped the runner's own reporting (e.g. a second interrupt
            # while the first was being reported): every failed cell still
            # gets an error event.
            if failure is None:
                failure = self.runner.last_exception or KeyboardInterrupt()
            self.runner.emit(stdlib_error_event(failure))
            status = "error"
        self.runner.emit({"type": "done", "status": status,
                          "execution_count": self.runner.cell_count})

    def init(self, request):
        status = "ok"
        try:
            for key, value in (request.get("env") or {}).items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[str(key)] = str(value)
            if request.get("cwd"):
                os.chdir(request["cwd"])
        except Exception as e:
            status = "error"
            self.channel.send({"type": "error", "ename": type(e).__name__,
                               "evalue": _safe_str(e), "traceback": []})
        self.channel.send({"type": "done", "status": status})

    def exit(self):
        """EOF on fd 3: run atexit handlers (they may print), exit 0.

        os._exit, not sys.exit: a user's non-daemon thread must not keep a
        context whose agent has gone away alive.
        """
        import atexit
        try:
            atexit._run_exitfuncs()
        except BaseException:  # noqa: B902
            pass
        self.hub.flush()
        os._exit(0)


INTR.shield(Driver.execute, Driver.handle_line, Driver.serve)


# --------------------------------------------------------------------------
# Fork server
# --------------------------------------------------------------------------

PR_SET_CHILD_SUBREAPER = 36


def fork_server():
    """`driver.py --fork-server`: prepare once, then fork a driver per request.

    Starting a driver costs the IPython import (a quarter of a second, more
    under load); a fork of a process that has done it costs a few
    milliseconds, and the forks share the imported modules' memory
    copy-on-write (gc.freeze() keeps the collector from touching, hence
    copying, them).  The agent starts one fork server per sandbox
    environment and asks it for drivers.

    fd 3 is a SOCK_SEQPACKET unix socket to the agent (fd 0-2: /dev/null);
    every message is one JSON object.  The server sends
    {"type":"ready","pid","mode","version"} once it is prepared (or
    {"type":"error","evalue"} and exits).  Each message the agent sends
    carries four descriptors (SCM_RIGHTS): the new driver's requests (read
    end), events (write end), stdout and stderr (write ends).  The server
    forks; the child becomes a session leader and a child subreaper (as the
    agent starts drivers), puts the four descriptors at 3, 4, 1 and 2 and
    goes on exactly like a driver the agent started itself: "ready" with its
    own pid on fd 4, then requests.  When a driver exits the server reaps it
    and sends {"type":"exit","pid","status"} (the raw wait status), which the
    agent reads as it would read its own child's.  EOF on fd 3 ends the
    server; its drivers live on, and PID 1 (the agent) reaps them.
    """
    import gc
    import socket
    ctl = socket.socket(fileno=REQ_FD)
    driver = Driver()
    try:
        driver.prepare()
        driver.runner.warm_up()
        import ctypes
        import fcntl
        libc = ctypes.CDLL(None, use_errno=True)
        if not hasattr(socket, "recv_fds"):
            raise RuntimeError("socket.recv_fds needs Python 3.9")
        if threading.active_count() != 1:
            raise RuntimeError("threads were started; forking would copy their locks")
    except BaseException as e:  # noqa: B902 - the agent starts drivers itself then
        ctl.send(json.dumps({"type": "error", "evalue": _safe_str(e)}).encode())
        os._exit(1)

    def reap(signum, frame):
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            try:
                ctl.send(json.dumps({"type": "exit", "pid": pid, "status": status}).encode())
            except OSError:
                pass

    gc.collect()
    gc.freeze()
    signal.signal(signal.SIGCHLD, reap)
    ctl.send(json.dumps({"type": "ready", "pid": os.getpid(), "mode": driver.runner.mode,
                         "version": _version()}).encode())
    while True:
        try:
            msg, fds, _flags, _addr = socket.recv_fds(ctl, 256, 4)
        except OSError:
            os._exit(0)
        if not msg and not fds:
            os._exit(0)
        if len(fds) != 4:
            for fd in fds:
                os.close(fd)
            continue
        if os.fork() == 0:
            _become_driver(driver, ctl, fds, libc, fcntl)   # never returns
        for fd in fds:
            os.close(fd)


def _become_driver(driver, ctl, fds, libc, fcntl):
    """In a child of the fork server: become the driver of a new context."""
    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        os.setsid()
        libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        ctl.detach()        # fd 3 is about to be the request pipe
        high = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10) for fd in fds]
        for fd in fds:
            os.close(fd)
        for target, fd in zip((REQ_FD, EV_FD, 1, 2), high):
            os.dup2(fd, target)
            os.close(fd)
        # The pages a cell touches are still the server's: copying them
        # (~20 ms of page faults) belongs here, before "ready" (warm drivers
        # do it while they wait), not in the context's first cell.
        driver.runner.warm_up()
        driver.go_live()
        driver.serve()      # exits the process
    except BaseException as e:  # noqa: B902
        try:
            os.write(2, ("sbx: forked driver failed: %r\n" % (e,)).encode())
        except OSError:
            pass
    finally:
        os._exit(70)


def main():
    if sys.argv[1:] == ["--fork-server"]:
        fork_server()
    driver = Driver()
    driver.start()
    driver.serve()


if __name__ == "__main__":
    main()
