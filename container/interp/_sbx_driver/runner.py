"""Running cells: BaseRunner (what both modes share) and StdlibRunner, the
mode without IPython (exec/eval of the cell's last expression, top-level
await on one persistent event loop, display())."""

import builtins
import io
import os
import sys
import types

from .proto import INLINE_STDLIB
from .mplhooks import HOOKS, _is_empty_figure, _want_inline_backend, flush_agg_figures
from .chart import chart_of
from .errors import stdlib_error_event
from .formatting import StdlibFormatter, encode_bundle


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
