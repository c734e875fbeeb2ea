"""Rich outputs: MIME bundles by IPython's rules (_repr_mimebundle_ first,
then _repr_html_ and the rest) for the standard-library mode."""

import types

from .channel import _b64
from .mplhooks import _print_figure_png
from .chart import _is_figure


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
