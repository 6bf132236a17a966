"""The timeline as inline SVG, drawn in Python: memory over the step stacked by category, the phases as
bands behind it, the allocated (and on a GPU the reserved) line, the peak marked with its module and op,
the device's capacity as a line. The HTML report adds a hover on top (html_assets.JS); a notebook shows
it as it is (no script).

Each point of the timeline is the memory after one stream event (report/timeline.py), held until the
next: it is drawn as a step, one column of equal width per point, so nothing is interpolated between
events. Every string from the model (module and op names) is escaped: a model is untrusted input.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from typing import Any

from trainmem.estimate.result import module_label
from trainmem.report.palette import CATEGORY_COLOURS, OTHER_COLOUR
from trainmem.units import format_bytes

COLOURS = CATEGORY_COLOURS  # the PNG's colours too (report/palette.py)
PHASE_FILLS = {"init": "#f4f4f6", "inputs": "#f1f1f4", "forward": "#e9f1fc", "loss": "#fdf3dc",
               "backward": "#fbe9e8", "optimizer": "#e7f6ec", "zero_grad": "#efeaf6"}
# A capacity more than this many times the highest point would flatten the drawing to a line at the bottom:
# it is then named in words at the top instead of drawn (the report's verdict says whether it fits).
CAPACITY_ON_SCALE = 3.0
SVG_WIDTH, PLOT_HEIGHT = 1000, 300
LEFT, RIGHT, TOP = 74, 14, 34  # margins around the plot area (axis labels left, phase names on top)
HALO = ' stroke="#fff" stroke-width="3" paint-order="stroke"'  # a white edge keeps a label readable over lines
LEGEND_ROW, CHAR_WIDTH = 18, 6.6  # legend row height and the width of a character at 11 px (for wrapping)


def geometry() -> dict[str, float]:
    return {"svg_width": SVG_WIDTH, "left": LEFT, "top": TOP, "width": SVG_WIDTH - LEFT - RIGHT,
            "height": PLOT_HEIGHT}


def _nice_step(span: float, ticks: int = 5) -> float:
    """A round tick step (1, 2, 2.5 or 5 × a power of ten) giving about `ticks` ticks over `span`."""
    raw = span / ticks
    power = 10 ** math.floor(math.log10(raw))
    return next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= raw)


def _y_axis(top_bytes: int) -> tuple[float, list[tuple[float, str]]]:
    """The axis top in bytes and its ticks (bytes, label), in the IEC unit the top reads in."""
    unit, name = next(((1024**k, u) for k, u in ((4, "TiB"), (3, "GiB"), (2, "MiB"), (1, "KiB"))
                       if top_bytes >= 1024**k), (1, "B"))
    step = _nice_step(max(top_bytes, 1) / unit)
    count = math.ceil(max(top_bytes, 1) / unit / step)
    ticks = [(i * step * unit, f"{i * step:g} {name}") for i in range(count + 1)]
    return count * step * unit, ticks


class _Scale:
    def __init__(self, points: int, top: float) -> None:
        self.points, self.top = max(points, 1), top or 1
        self.width = SVG_WIDTH - LEFT - RIGHT

    def x(self, position: float) -> float:
        return round(LEFT + position * self.width / self.points, 1)

    def y(self, value: float) -> float:
        return round(TOP + PLOT_HEIGHT - value / self.top * PLOT_HEIGHT, 1)


def _edge(scale: _Scale, values: Sequence[float], backward: bool = False) -> list[str]:
    """Path commands along a step edge from its first column's value, left to right (or right to left):
    a V where the value changes between two columns, one H across each run of equal values."""
    count = len(values)
    order = range(count - 2, -1, -1) if backward else range(1, count)
    out, current = [], scale.y(values[-1] if backward else values[0])
    for i in order:
        y = scale.y(values[i])
        if y != current:
            out += [f"H{scale.x(i + 1 if backward else i)}", f"V{y}"]
            current = y
    out.append(f"H{scale.x(0 if backward else count)}")
    return out


def _band_path(scale: _Scale, lower: Sequence[int], upper: Sequence[int]) -> str:
    start = f"M{scale.x(0)},{scale.y(upper[0])}"
    back = f"V{scale.y(lower[-1])}" + "".join(_edge(scale, lower, backward=True))
    return start + "".join(_edge(scale, upper)) + back + "Z"


def _line_path(scale: _Scale, values: Sequence[int]) -> str:
    return f"M{scale.x(0)},{scale.y(values[0])}" + "".join(_edge(scale, values))


def _series(t: Any, scale: _Scale) -> list[str]:
    """One filled band per category, bottom to top in the timeline's stacking order."""
    out, lower = [], [0] * len(t.index)
    for name in t.categories:
        upper = [a + b for a, b in zip(lower, t.by_category[name])]
        at_peak = t.by_category[name][t.peak]
        out.append(f'<path class="tm-series" data-category="{html.escape(name)}" data-peak-bytes="{at_peak}" '
                   f'fill="{COLOURS.get(name, OTHER_COLOUR)}" stroke="none" '
                   f'd="{_band_path(scale, lower, upper)}"><title>{html.escape(name)}</title></path>')
        lower = upper
    return out


def _bands(t: Any, scale: _Scale) -> list[str]:
    out = []
    for band in t.bands:
        x0, x1 = scale.x(band.start), scale.x(band.stop)
        label = html.escape(f"{band.phase}, step {band.step}")
        out.append(f'<rect class="tm-band" data-phase="{html.escape(band.phase)}" x="{x0}" y="{TOP}" '
                   f'width="{round(x1 - x0, 1)}" height="{PLOT_HEIGHT}" '
                   f'fill="{PHASE_FILLS.get(band.phase, "#f3f3f3")}">'
                   f'<title>{label}</title></rect>')
        name = band.phase.replace("_", " ")
        if x1 - x0 > len(name) * CHAR_WIDTH + 6:  # named where the name fits
            out.append(f'<text x="{round((x0 + x1) / 2, 1)}" y="{TOP - 6}" text-anchor="middle">'
                       f'{html.escape(name)}</text>')
    return out


def _axes(scale: _Scale, ticks: list[tuple[float, str]], t: Any) -> list[str]:
    bottom = TOP + PLOT_HEIGHT
    out = [f'<line x1="{LEFT}" y1="{bottom}" x2="{SVG_WIDTH - RIGHT}" y2="{bottom}" stroke="#555"/>']
    for value, label in ticks:
        y = scale.y(value)
        out.append(f'<line x1="{LEFT}" y1="{y}" x2="{SVG_WIDTH - RIGHT}" y2="{y}" stroke="#000" '
                   'stroke-opacity="0.08"/>')
        out.append(f'<text x="{LEFT - 6}" y="{y + 4}" text-anchor="end">{label}</text>')
    count = len(t.index)
    for k in range(5):
        position = min(count - 1, round(k * (count - 1) / 4)) if count else 0
        x = scale.x(position + 0.5)
        label = t.index[position] if count else 0
        out.append(f'<text x="{x}" y="{bottom + 15}" text-anchor="middle">{label}</text>')
    out.append(f'<text x="{LEFT + scale.width / 2}" y="{bottom + 31}" text-anchor="middle">'
               f'stream event (allocations and frees in order; {len(t.index):,} points of {t.events:,} events)</text>')
    return out


def _peak(t: Any, scale: _Scale) -> list[str]:
    x, y = scale.x(t.peak + 0.5), scale.y(t.peak_bytes)
    words = html.escape(f"peak {format_bytes(t.peak_bytes)} · {t.peak_phase} · {module_label(t.peak_module)} · "
                        f"{t.peak_op}")
    anchor, dx = ("end", -8) if x > LEFT + 0.6 * scale.width else ("start", 8)
    return [f'<g class="tm-peak" data-peak-bytes="{t.peak_bytes}">',
            f'<line x1="{x}" y1="{TOP}" x2="{x}" y2="{TOP + PLOT_HEIGHT}" stroke="#b00020" stroke-dasharray="4 3"/>',
            f'<circle cx="{x}" cy="{y}" r="4" fill="#b00020"/>',
            f'<text x="{x + dx}" y="{max(y - 8, TOP + 12)}" text-anchor="{anchor}" font-weight="600"{HALO}>'
            f'{words}</text></g>']


def _capacity(t: Any, scale: _Scale, device_name: str) -> list[str]:
    y = scale.y(t.capacity_bytes)
    words = f"capacity {format_bytes(t.capacity_bytes)} ({device_name})"
    return [f'<line class="tm-capacity" x1="{LEFT}" y1="{y}" x2="{SVG_WIDTH - RIGHT}" y2="{y}" stroke="#8a1c1c" '
            f'stroke-width="1.5" stroke-dasharray="7 4"/>',
            f'<text x="{SVG_WIDTH - RIGHT - 4}" y="{y - 5 if y - TOP > 16 else y + 14}" text-anchor="end" '
            f'fill="#8a1c1c"{HALO}>{html.escape(words)}</text>']  # below the line where the phase names are above


def _capacity_words(t: Any, device_name: str) -> str:
    """The capacity in words, for a capacity too far above the drawing to be a line in it."""
    times = t.capacity_bytes / max(t.peak_bytes, 1)
    return (f"capacity {format_bytes(t.capacity_bytes)} ({device_name}): {times:,.0f}× the peak, far above this "
            "scale (not drawn)")


def _legend(t: Any, y0: float, allocated_name: str, notes: list[str]) -> tuple[list[str], float]:
    """Swatches with each category's bytes at the peak, wrapped into rows, and each note on a row of its own;
    returns the items and their height."""
    items = [(COLOURS.get(name, OTHER_COLOUR), f"{name} {format_bytes(t.by_category[name][t.peak])}", "box")
             for name in reversed(t.categories)]
    items.append(("#1d2330", allocated_name, "line"))
    if t.reserved is not None:
        items.append(("#1d2330", "reserved", "dash"))
    out, x, y = [], LEFT, y0
    for colour, words, kind in items:
        width = 22 + len(words) * CHAR_WIDTH + 14
        if x + width > SVG_WIDTH - RIGHT and x > LEFT:
            x, y = LEFT, y + LEGEND_ROW
        if kind == "box":
            out.append(f'<rect x="{x}" y="{y - 9}" width="12" height="11" fill="{colour}"/>')
        else:
            dash = ' stroke-dasharray="5 3"' if kind == "dash" else ""
            out.append(f'<line x1="{x}" y1="{y - 4}" x2="{x + 14}" y2="{y - 4}" stroke="{colour}" '
                       f'stroke-width="1.5"{dash}/>')
        out.append(f'<text x="{x + 18}" y="{y}">{html.escape(words)}</text>')
        x += width
    for note in notes:
        y += LEGEND_ROW
        out.append(f'<text class="tm-note" x="{LEFT}" y="{y}" fill="#8a1c1c">{html.escape(note)}</text>')
    return out, y - y0 + LEGEND_ROW


def timeline_svg(t: Any, device_name: str, allocated_name: str = "allocated", interactive: bool = False,
                 process_note: str = "") -> str:
    """The whole drawing as one <svg> element (viewBox scaled to the page's width); `process_note` says what
    the process holds beyond the allocator (the drawing shows the allocator's bytes only)."""
    data_top = max([*t.allocated, *(t.reserved or ()), 1])
    on_scale = t.capacity_bytes <= CAPACITY_ON_SCALE * data_top
    axis_top, ticks = _y_axis(max(data_top, t.capacity_bytes) if on_scale else data_top)
    scale = _Scale(len(t.index), axis_top)
    notes = [note for note in ("" if on_scale else _capacity_words(t, device_name), process_note) if note]
    legend, legend_height = _legend(t, TOP + PLOT_HEIGHT + 56, allocated_name, notes)
    height = round(TOP + PLOT_HEIGHT + 56 + legend_height)
    parts = [f'<svg class="tm-timeline" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {SVG_WIDTH} {height}" '
             f'width="{SVG_WIDTH}" height="{height}" role="img" data-series="{len(t.categories)}"'
             + (' tabindex="0" focusable="true"' if interactive else "") + ">",
             "<title>Memory over the training step, stacked by category</title>",
             *_bands(t, scale), *_series(t, scale),
             f'<path class="tm-allocated" d="{_line_path(scale, t.allocated)}" fill="none" stroke="#1d2330" '
             'stroke-width="1"/>']
    if t.reserved is not None:
        parts.append(f'<path class="tm-reserved" d="{_line_path(scale, t.reserved)}" fill="none" stroke="#1d2330" '
                     'stroke-width="1.2" stroke-dasharray="5 3"/>')
    parts += [*_axes(scale, ticks, t), *(_capacity(t, scale, device_name) if on_scale else []),
              *_peak(t, scale), *legend]
    if interactive:  # the area the hover listens on, above everything drawn
        parts.append(f'<rect class="tm-hit" x="{LEFT}" y="{TOP}" width="{scale.width}" height="{PLOT_HEIGHT}" '
                     'fill="transparent"/>')
    return "\n".join(parts + ["</svg>"])
