"""IPython mode: an IPython InteractiveShell wired like ipykernel's
ZMQInteractiveShell so that outputs match Jupyter; IPython imported with
its terminal parts deferred."""

import sys
import types

from .proto import INLINE_IPYTHON
from .mplhooks import HOOKS, _is_empty_figure, _want_inline_backend, flush_agg_figures
from .chart import chart_of
from .errors import _safe_str, strip_ansi, strip_driver_frames
from .formatting import encode_bundle
from .runner import BaseRunner


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


def _fast_format_calls(shell):
    """Formatters' __call__ are wrapped by IPython's @catch_format_error,
    made with the `decorator` package, whose wrapper binds every call to the
    signature (inspect.Signature.bind, ~10 us) before calling the real
    wrapper; a cell's value goes through a dozen formatters, and the binds
    were ~20 % of the driver's `1+1` round trip (docs/benchmarks.md).  For calls that the signature accepts as they
    are (all required arguments positional, keywords only for the later
    parameters: the bind cannot fail and changes nothing the method sees),
    call catch_format_error's body directly; anything else still goes
    through the original wrapper.  Same behaviour, errors included."""
    import inspect
    fmt = shell.display_formatter
    objs = list(fmt.formatters.values()) + [fmt.ipython_display_formatter,
                                           fmt.mimebundle_formatter]
    done = set()
    for cls in {c for obj in objs for c in type(obj).__mro__}:
        fun = cls.__dict__.get("__call__")
        if fun is None or fun in done or getattr(fun, "__closure__", None) is None:
            continue
        cells = dict(zip(fun.__code__.co_freevars, (c.cell_contents for c in fun.__closure__)))
        caller, func = cells.get("caller"), cells.get("func")
        if (getattr(caller, "__name__", "") != "catch_format_error" or func is not fun.__wrapped__
                or cells.get("extras") != () or cells.get("kwsyntax") is not False):
            continue
        params = list(inspect.signature(func).parameters.values())
        if any(p.kind != p.POSITIONAL_OR_KEYWORD for p in params):
            continue
        # self and obj positional: catch_format_error reads args[0]
        least = max(2, sum(1 for p in params if p.default is p.empty))
        fast = _make_fast_call(fun, caller, func, least, len(params), tuple(p.name for p in params))
        done.add(fast)
        setattr(cls, "__call__", fast)


# Compiled under a name that is not one of the driver's files: a traceback
# through it (a KeyboardInterrupt inside a formatter, a call the signature
# refuses) keeps the frames below it (errors.strip_driver_frames cuts at the
# first driver frame), as one through the decorator's wrapper does.
_FAST_CALL_SRC = """
def __call__(*args, **kwargs):
    if least <= len(args) <= most and (not kwargs or kwargs.keys() <= set(names[len(args):])):
        return caller(func, *args, **kwargs)
    return wrapped(*args, **kwargs)
"""


def _make_fast_call(wrapped, caller, func, least, most, names):
    scope = {"wrapped": wrapped, "caller": caller, "func": func, "least": least, "most": most,
             "names": names}
    exec(compile(_FAST_CALL_SRC, "<sbx: formatter call>", "exec"), scope)
    fast = scope["__call__"]
    fast.__wrapped__ = func
    fast.__doc__ = func.__doc__
    fast.__qualname__ = func.__qualname__
    return fast

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
        _fast_format_calls(self.shell)
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
