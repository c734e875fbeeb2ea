"""Charts: a matplotlib figure described as the SDK's ChartData (type,
title, data, layout) next to its PNG."""

import sys

from .errors import _safe_str


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
