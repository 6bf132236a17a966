"""Memory as pictures: `write_timeline_plot` (memory over the training step, `trainmem estimate --plot`) and
`write_peaks_plot` (peaks across configurations, for `trainmem compare` and `--sweep`).

matplotlib is an optional extra (`pip install 'trainmem[plot]'`), imported here only, and only when a plot
is asked for. Figures are built as `matplotlib.figure.Figure` on the Agg canvas, never through pyplot: no GUI
backend is chosen or opened and no global figure state is kept, so a plot made in a headless job, a test or
a notebook behaves the same. The data come from report/timeline.py; this module only draws them."""

from __future__ import annotations

import bisect
import math
from pathlib import Path
from typing import Any

from trainmem.errors import TrainmemError, quote, short
from trainmem.report.palette import CATEGORY_COLOURS, OTHER_COLOUR
from trainmem.units import format_bytes

INSTALL_HINT = "pip install 'trainmem[plot]'"
FORMATS = {".png": "png", ".svg": "svg"}  # the file's extension picks the format

# The phase bands are pale tints behind the areas; the words in each band say the phase, the tint only
# groups the narrow bands (loss, zero_grad) that have no room for words.
PHASE_COLOURS = {"init": "#DDDDDD", "inputs": "#DDDDDD", "forward": "#56B4E9", "loss": "#F0E442",
                 "backward": "#E69F00", "optimizer": "#009E73", "zero_grad": "#CC79A7"}
PHASE_ALPHA = 0.13
LINE_STYLES = {"allocated": dict(color="#000000", linewidth=1.2, linestyle="-"),
               "reserved": dict(color="#000000", linewidth=1.2, linestyle="--"),
               "capacity": dict(color="#B2182B", linewidth=1.5, linestyle="-.")}
PEAK_SERIES_COLOURS = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442", "#999999")
CAPACITY_COLOURS = ("#B2182B", "#000000", "#555555", "#882255")
# A capacity line more than this many times above the data squeezes the data into the bottom third of the
# plot; the title states such a capacity instead of drawing it (a choice of readability, not of memory).
CAPACITY_SCALE = 3
# The timeline's y axis reaches 1.3x the highest line: the top quarter holds the band words and the peak's
# note (three lines of 8-point text, about an eighth of the axes' height), so neither hides data.
TIMELINE_HEADROOM = 1.3
PEAK_NOTE_TOP = 0.93
BAND_LABEL_MIN = 0.025  # bands narrower than this share of the x axis get no words (they would overlap)
UNITS = ("B", "KiB", "MiB", "GiB", "TiB")


def write_timeline_plot(estimate: Any, path: str | Path) -> None:
    """Draw memory over the traced training step of `estimate` into `path` (.png or .svg)."""
    target, fmt = _checked_path(path, "--plot")
    _save(timeline_figure(estimate), target, fmt, "--plot")


def write_peaks_plot(labels: list[str], series: dict[str, list[int]], capacities: dict[str, int],
                     path: str | Path, title: str, *, where: str = "--plot") -> None:
    """A grouped bar chart of peaks across configurations (one group per label, one bar per series) with
    each named device's capacity as a dashed line, into `path` (.png or .svg)."""
    target, fmt = _checked_path(path, where)
    _save(peaks_figure(labels, series, capacities, title, where=where), target, fmt, where)


def timeline_figure(estimate: Any, max_points: int = 4000) -> Any:
    """The timeline plot of `estimate` as a matplotlib Figure (for notebooks and tests)."""
    _matplotlib()
    from trainmem.report.timeline import timeline

    line = timeline(estimate, max_points=max_points)
    return draw_timeline(line, _timeline_title(estimate))


def draw_timeline(line: Any, title: tuple[str, str]) -> Any:
    """Draw a report.timeline.Timeline: phase bands, stacked categories, allocated/reserved, peak, capacity."""
    mpl = _matplotlib()
    figure = mpl.Figure(figsize=(12, 6), dpi=100, layout="constrained")
    mpl.FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    x = list(range(len(line.index)))
    top = _draw_stack(axes, x, line)
    if line.gpu:
        for name in ("allocated", "reserved"):
            values = getattr(line, name)
            if values is not None:
                axes.plot(x, values, label=name, gid=f"line-{name}", drawstyle="steps-post", **LINE_STYLES[name])
                top = max(top, max(values, default=0))
    drawn, note = _capacity(axes, {"capacity": line.capacity_bytes}, top)
    top = max([top, *drawn])
    _draw_bands(axes, line)
    _mark_peak(axes, line)
    _finish_axes(axes, top, x, headroom=TIMELINE_HEADROOM)
    axes.set_xticks(*_event_ticks(line.index, mpl))
    drawn_as = ("each drawn" if len(x) == line.events else
                f"drawn as {len(x):,} points, each the highest of {line.events / max(1, len(x)):.1f} events in turn")
    axes.set_xlabel(f"op sequence: device stream event number ({line.events:,} events in the traced steps, {drawn_as})")
    axes.set_title(title[0] + ("\n" + title[1] + note if title[1] or note else ""), fontsize=11, pad=14)
    _legends(axes, line)
    return figure


def peaks_figure(labels: list[str], series: dict[str, list[int]], capacities: dict[str, int], title: str,
                 *, where: str = "--plot") -> Any:
    """The grouped bar chart of write_peaks_plot as a matplotlib Figure."""
    _check_series(labels, series, where)
    mpl = _matplotlib(where)
    figure = mpl.Figure(figsize=(max(7.0, 1.1 * len(labels) * max(1, len(series)) ** 0.5 + 3), 5.5),
                        dpi=100, layout="constrained")
    mpl.FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    width = 0.8 / max(1, len(series))
    top = 0
    for number, (name, values) in enumerate(series.items()):
        offsets = [i - 0.4 + width * (number + 0.5) for i in range(len(labels))]
        bars = axes.bar(offsets, values, width, label=name, gid=f"series-{name}",
                        color=PEAK_SERIES_COLOURS[number % len(PEAK_SERIES_COLOURS)])
        axes.bar_label(bars, labels=[format_bytes(v) for v in values], fontsize=7,
                       rotation=90 if len(labels) * len(series) > 6 else 0, padding=2)
        top = max([top, *values])
    drawn, note = _capacity(axes, capacities, top, dashed=True)
    top = max([top, *drawn])
    axes.set_xticks(range(len(labels)), labels, rotation=30 if _crowded(labels) else 0,
                    ha="right" if _crowded(labels) else "center")
    _finish_axes(axes, top * 1.08, None)  # room for the bars' labels
    axes.set_ylabel("peak memory")
    axes.set_title(title + note, fontsize=11)
    figure.legend(*axes.get_legend_handles_labels(), loc="outside right upper", fontsize=8, frameon=False)
    return figure


# --- parts of the timeline plot ---------------------------------------------------------------------------

def _draw_stack(axes: Any, x: list[int], line: Any) -> int:
    """One filled area per category, stacked in the Timeline's order; returns the stack's highest top."""
    lower = [0] * len(x)
    for name in line.categories:
        upper = [low + value for low, value in zip(lower, line.by_category[name])]
        axes.fill_between(x, lower, upper, step="post", label=name, gid=f"category-{name}", linewidth=0, alpha=0.9,
                          color=CATEGORY_COLOURS.get(name, OTHER_COLOUR))
        lower = upper
    return max(lower, default=0)


def _draw_bands(axes: Any, line: Any) -> None:
    """A pale band per phase of each step, with its phase written in it, and a rule where each step starts."""
    span = max(1, len(line.index))
    steps_seen: set[int] = set()
    for band in line.bands:
        axes.axvspan(band.start, band.stop, color=PHASE_COLOURS.get(band.phase, OTHER_COLOUR),
                     alpha=PHASE_ALPHA, linewidth=0, zorder=0, gid=f"band-{band.phase}-{band.step}")
        if band.step not in steps_seen and band.phase not in ("init", "inputs"):
            steps_seen.add(band.step)
            axes.axvline(band.start, color="#777777", linewidth=0.6, zorder=0.5)
            axes.text(band.start, 1.005, f"step {band.step} ▸", transform=axes.get_xaxis_transform(),
                      fontsize=7, color="#444444", va="bottom", ha="left")
        if (band.stop - band.start) / span >= BAND_LABEL_MIN:
            axes.text((band.start + band.stop) / 2, 0.985, band.phase, transform=axes.get_xaxis_transform(),
                      fontsize=8, color="#333333", ha="center", va="top",
                      rotation=0 if (band.stop - band.start) / span > 0.08 else 90)


def _mark_peak(axes: Any, line: Any) -> None:
    """A dot on the allocated peak and a note naming its bytes, module, op, phase and step, and the largest
    categories there: a peak is often one point wide, too narrow to see which colours make it."""
    from trainmem.estimate.result import module_label

    y = line.allocated[line.peak]  # the stacked categories add up to it (report/timeline.py)
    left = line.peak > len(line.index) / 2
    axes.plot([line.peak], [y], marker="o", markersize=6, color="#000000", linestyle="none", zorder=5)
    largest = sorted(((line.by_category[c][line.peak], c) for c in line.categories), reverse=True)[:3]
    parts = ", ".join(f"{name} {format_bytes(value)}" for value, name in largest if value > 0)
    text = (f"peak {format_bytes(line.peak_bytes)}: {line.peak_phase}, step {line.step[line.peak]}\n"
            f"{module_label(line.peak_module)} · {line.peak_op}\n{parts}")
    # the note sits in the headroom above the data (PEAK_NOTE_TOP of the axes' height), beside the peak
    beside = line.peak + (-1 if left else 1) * 0.02 * len(line.index)
    axes.annotate(text, xy=(line.peak, y), xytext=(beside, PEAK_NOTE_TOP), textcoords=("data", "axes fraction"),
                  ha="right" if left else "left", va="top", fontsize=8, zorder=6, gid="peak",
                  bbox=dict(boxstyle="round,pad=0.3", facecolor="white", edgecolor="#777777", alpha=0.9),
                  arrowprops=dict(arrowstyle="->", color="#000000", linewidth=0.8))


def _legends(axes: Any, line: Any) -> None:
    """Categories and lines on the right, top; the phase tints below them (outside the axes, so the
    constrained layout makes room for them)."""
    mpl = _matplotlib()
    figure = axes.get_figure()
    figure.legend(*axes.get_legend_handles_labels(), loc="outside right upper", fontsize=8, frameon=False,
                  title="memory", title_fontsize=8)
    phases = list(dict.fromkeys(band.phase for band in line.bands))
    patches = [mpl.Patch(color=PHASE_COLOURS.get(p, OTHER_COLOUR), alpha=PHASE_ALPHA * 3, label=p) for p in phases]
    figure.legend(handles=patches, loc="outside right lower", fontsize=8, frameon=False, title="phase",
                  title_fontsize=8)


def _timeline_title(estimate: Any) -> tuple[str, str]:
    """The model; then what sizes the step: batch, accumulation, checkpointing, precision, optimizer, device,
    and for many ranks whose memory is drawn (the most loaded role's replay, estimate/result.py)."""
    setup = estimate.setup
    device = estimate.device
    first = f"{estimate.model_name}: memory over the training step"
    parts = [f"batch {setup.batch_size}"]
    parts += [f"{setup.grad_accum} micro-batches a step"] if setup.grad_accum > 1 else []
    parts += ["checkpointing"] if setup.checkpointing else []
    parts += [str(setup.precision), str(setup.optimizer), f"{device.name} ({format_bytes(device.capacity_bytes)})"]
    if estimate.parallel is not None:
        layout = estimate.parallel.get("layout") or {}
        label = (estimate.parallel.get("most_loaded") or {}).get("label", "")
        ranks = f"{layout.get('strategy', 'many ranks')} × {layout.get('world_size', '?')}"
        parts.append(f"{ranks}, most loaded: {label}" if len(estimate.ranks) > 1 else f"{ranks}, every rank alike")
    return first, " · ".join(parts)


def _event_ticks(index: tuple[int, ...], mpl: Any) -> tuple[list[float], list[str]]:
    """x ticks at round stream event numbers. Point p holds from event index[p] until index[p + 1] (steps
    drawn "post"), so event e sits at p + (e - index[p]) / (index[p + 1] - index[p])."""
    if not index:
        return [], []
    positions, labels = [], []
    for event in mpl.ticker.MaxNLocator(nbins=10, steps=[1, 2, 2.5, 5, 10], integer=True).tick_values(0, index[-1]):
        event = int(event)
        if not index[0] <= event <= index[-1]:
            continue
        point = bisect.bisect_right(index, event) - 1
        after = index[point + 1] if point + 1 < len(index) else index[point] + 1
        positions.append(point + (event - index[point]) / (after - index[point]))
        labels.append(f"{event:,}")
    return positions, labels


# --- shared parts -------------------------------------------------------------------------------------------

def _capacity(axes: Any, capacities: dict[str, int], top: int, dashed: bool = False) -> tuple[list[int], str]:
    """Draw each capacity within CAPACITY_SCALE of the data as a horizontal line; return the drawn ones and a
    title note naming those left off the scale."""
    drawn, off = [], []
    for number, (name, capacity) in enumerate(capacities.items()):
        if top > 0 and capacity > CAPACITY_SCALE * top:
            off.append(f"{name} {format_bytes(capacity)}")
            continue
        style = dict(LINE_STYLES["capacity"]) if not dashed else dict(
            color=CAPACITY_COLOURS[number % len(CAPACITY_COLOURS)], linewidth=1.3, linestyle="--")
        label = "capacity" if not dashed else f"{name} ({format_bytes(capacity)})"
        axes.axhline(capacity, label=label, gid="line-capacity" if not dashed else f"capacity-{name}", **style)
        drawn.append(capacity)
    if not off:
        return drawn, ""
    if not dashed:
        return drawn, "\n(the capacity is above the scale: not drawn, as the data would be flattened)"
    return drawn, f" (above the scale, not drawn: {', '.join(off)})"


def _finish_axes(axes: Any, top: int, x: list[int] | None, headroom: float = 1.18) -> None:
    """y from zero with IEC ticks, room above the highest line for the band words; x tight."""
    mpl = _matplotlib()
    top = max(int(top), 1)
    unit, name = _iec_unit(top)
    step = _nice_step(top / unit) * unit
    axes.set_ylim(0, top * headroom)
    axes.yaxis.set_major_locator(mpl.ticker.MultipleLocator(step))
    axes.yaxis.set_major_formatter(mpl.ticker.FuncFormatter(lambda value, _: f"{value / unit:g} {name}"))
    axes.grid(axis="y", color="#DDDDDD", linewidth=0.6)
    axes.set_axisbelow(True)
    if x is not None:
        axes.set_xlim(0, max(1, len(x)))  # the last point holds until the end of its step (steps-post)
        axes.set_ylabel("memory (bytes, IEC units)")


def _iec_unit(top: int) -> tuple[int, str]:
    """The largest IEC unit that the axis's top reaches: 3.2e9 B -> (1 GiB, 'GiB')."""
    for power in range(len(UNITS) - 1, -1, -1):
        if top >= 1024**power:
            return 1024**power, UNITS[power]
    return 1, "B"


def _nice_step(span: float) -> float:
    """About six ticks over `span` units, at 1, 2, 2.5 or 5 times a power of ten (2.5 -> 0.5)."""
    raw = span / 6
    magnitude = 10 ** math.floor(math.log10(raw))
    return next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)


def _crowded(labels: list[str]) -> bool:
    return len(labels) > 4 or any(len(label) > 14 for label in labels)


def _check_series(labels: list[str], series: dict[str, list[int]], where: str) -> None:
    if not labels or not series:
        raise TrainmemError(f"expected at least one configuration and one series to plot, got {len(labels)} "
                            f"configurations and {len(series)} series", where=where)
    for name, values in series.items():
        if len(values) != len(labels):
            raise TrainmemError(f"expected one value per configuration ({len(labels)}) in series {name!r}, "
                                f"got {len(values)}", where=where)


def _checked_path(path: str | Path, where: str) -> tuple[Path, str]:
    """The output path and its format; refused before any work when the extension or folder is wrong."""
    target = Path(path)
    fmt = FORMATS.get(target.suffix.lower())
    if fmt is None:
        raise TrainmemError(f"expected a .png or .svg file, got {quote(str(path))}", where=where)
    if not target.parent.is_dir():
        raise TrainmemError(f"expected a file in an existing folder, got {quote(str(path))} "
                            f"({short(str(target.parent))} is not a folder)", where=where)
    _matplotlib(where)
    return target, fmt


def _save(figure: Any, target: Path, fmt: str, where: str) -> None:
    """Write the figure. Nothing in the file depends on the clock or on chance (no creation date; SVG
    ids from a fixed salt, matplotlib's `svg.hashsalt`): the same estimate draws the same bytes, so a
    committed image changes in a diff only when the estimate does."""
    import matplotlib

    metadata = {"Date": None} if fmt == "svg" else {"Software": None}
    try:
        with matplotlib.rc_context({"svg.hashsalt": "trainmem"}):
            figure.savefig(target, format=fmt, metadata=metadata)
    except OSError as error:
        raise TrainmemError(f"expected a writable file, got {quote(str(target))} ({error.strerror or error})",
                            where=where) from None


class _Matplotlib:
    """The few matplotlib names this module draws with, imported once on first use."""

    def __init__(self) -> None:
        from matplotlib import ticker
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.patches import Patch

        self.Figure, self.FigureCanvasAgg, self.Patch, self.ticker = Figure, FigureCanvasAgg, Patch, ticker


def _matplotlib(where: str = "--plot") -> _Matplotlib:
    try:
        return _Matplotlib()
    except ImportError:
        raise TrainmemError(f"expected matplotlib to draw a plot, got it not installed ({INSTALL_HINT})",
                            where=where) from None
