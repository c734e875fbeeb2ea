"""Import hooks (a sys.meta_path finder: callbacks after an import,
synthetic modules) and the matplotlib integration: figures drawn in a cell
shown as PNG at its end, as ipykernel's inline backend does."""

import io
import os
import sys

from .proto import INLINE_IPYTHON, INLINE_STDLIB


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
