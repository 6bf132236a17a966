"""The timeline and peaks plots (report/plot.py): what the figure draws, checked on matplotlib's own
artists (one filled area per category, the allocated/reserved/capacity lines, the peak's note), and the
files written by extension."""

from __future__ import annotations

import re
import sys

import pytest

pytest.importorskip("matplotlib")

import trainmem  # noqa: E402
from trainmem.errors import TrainmemError  # noqa: E402
from trainmem.report import plot  # noqa: E402
from trainmem.report.timeline import timeline  # noqa: E402
from trainmem.units import format_bytes  # noqa: E402

MLP = dict(batch_size=64, optimizer="adam", input_shape="1000")
GIB = 1024**3


@pytest.fixture(scope="module")
def cpu_estimate():
    return trainmem.estimate("mlp:1000-100-100-10", **MLP)


@pytest.fixture(scope="module")
def gpu_estimate():
    return trainmem.estimate("mlp:1000-100-100-10", device="a100-40gb", **MLP)


def _areas(axes):
    from matplotlib.collections import PolyCollection

    return [c for c in axes.collections if isinstance(c, PolyCollection)]


def _lines(axes):
    return {line.get_label(): line for line in axes.get_lines() if not line.get_label().startswith("_")}


def _top_at(area, x):
    """The highest y the filled area reaches at x (steps drawn "post": the point's own value is there)."""
    return max(y for vx, y in area.get_paths()[0].vertices if vx == x)


def test_gpu_plot_draws_each_category_the_allocator_lines_and_the_peak(gpu_estimate):
    line = timeline(gpu_estimate)
    axes = plot.timeline_figure(gpu_estimate).axes[0]
    areas = _areas(axes)
    assert [a.get_label() for a in areas] == list(line.categories)
    assert len(areas) == len(line.categories) >= 4  # parameters, gradients, optimizer state, activations …
    lines = _lines(axes)
    assert {"allocated", "reserved"} <= set(lines)
    assert list(lines["allocated"].get_ydata()) == list(line.allocated)
    assert list(lines["reserved"].get_ydata()) == list(line.reserved)
    # the stacked top at the peak is the categories' sum there, which is the allocated peak
    at_peak = sum(line.by_category[c][line.peak] for c in line.categories)
    assert _top_at(areas[-1], line.peak) == at_peak == line.peak_bytes == gpu_estimate.allocated_bytes
    note = next(t for t in axes.texts if t.get_gid() == "peak").get_text()
    assert line.peak_op in note and format_bytes(line.peak_bytes) in note and line.peak_phase in note
    largest = max(line.categories, key=lambda c: line.by_category[c][line.peak])
    assert f"{largest} {format_bytes(line.by_category[largest][line.peak])}" in note


def test_capacity_far_above_the_data_is_named_in_the_title_not_drawn(gpu_estimate):
    axes = plot.timeline_figure(gpu_estimate).axes[0]  # 40 GiB against a peak of a few MiB
    assert "capacity" not in _lines(axes)
    assert "capacity is above the scale" in axes.get_title()
    assert "a100-40gb (40.00 GiB)" in axes.get_title() and "batch 64" in axes.get_title()


def test_capacity_near_the_data_is_a_line():
    est = trainmem.estimate("mlp:1000-100-100-10", device="custom:capacity=48MiB,cc=8.0", **MLP)
    axes = plot.timeline_figure(est).axes[0]
    capacity = _lines(axes)["capacity"]
    assert list(capacity.get_ydata()) == [48 * 1024**2] * 2
    assert axes.get_ylim()[1] > 48 * 1024**2


def test_cpu_plot_has_areas_and_bands_but_no_allocator_lines(cpu_estimate):
    line = timeline(cpu_estimate)
    axes = plot.timeline_figure(cpu_estimate).axes[0]
    assert [a.get_label() for a in _areas(axes)] == list(line.categories)
    assert not {"allocated", "reserved"} & set(_lines(axes))
    assert _top_at(_areas(axes)[-1], line.peak) == line.peak_bytes
    bands = [p for p in axes.patches if (p.get_gid() or "").startswith("band-")]
    assert [p.get_gid() for p in bands] == [f"band-{b.phase}-{b.step}" for b in line.bands]
    words = {t.get_text() for t in axes.texts}
    assert {"forward", "backward", "optimizer"} <= words


def test_y_ticks_are_iec_units(gpu_estimate):
    figure = plot.timeline_figure(gpu_estimate)
    figure.canvas.draw()
    axes = figure.axes[0]
    bottom, top = axes.get_ylim()
    labels = [t.get_text() for t in axes.get_yticklabels() if bottom <= t.get_position()[1] <= top]
    assert labels[0] == "0 MiB" and len(labels) >= 4, labels
    assert all(re.fullmatch(r"[0-9.]+ MiB", text) for text in labels), labels


def test_png_and_svg_by_extension(gpu_estimate, tmp_path):
    line = timeline(gpu_estimate)
    plot.write_timeline_plot(gpu_estimate, tmp_path / "t.png")
    assert (tmp_path / "t.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    plot.write_timeline_plot(gpu_estimate, str(tmp_path / "t.SVG"))
    svg = (tmp_path / "t.SVG").read_text()
    groups = re.findall(r'<g id="category-([a-z_]+)"', svg)
    assert groups == list(line.categories)
    assert '<g id="line-allocated"' in svg and '<g id="line-reserved"' in svg
    plot.write_timeline_plot(gpu_estimate, tmp_path / "again.svg")  # no date inside: same estimate, same file
    assert (tmp_path / "again.svg").read_text() == svg


def test_cpu_svg_has_no_allocator_lines(cpu_estimate, tmp_path):
    plot.write_timeline_plot(cpu_estimate, tmp_path / "cpu.svg")
    svg = (tmp_path / "cpu.svg").read_text()
    assert len(re.findall(r'<g id="category-', svg)) == len(timeline(cpu_estimate).categories)
    assert "line-allocated" not in svg and "line-reserved" not in svg


@pytest.mark.parametrize("name", ["t.pdf", "t", "t.png.txt"])
def test_other_extensions_are_refused(cpu_estimate, tmp_path, name):
    with pytest.raises(TrainmemError, match=r"expected a \.png or \.svg file, got") as error:
        plot.write_timeline_plot(cpu_estimate, tmp_path / name)
    assert error.value.where == "--plot"
    assert not (tmp_path / name).exists()


def test_missing_folder_is_refused(cpu_estimate, tmp_path):
    with pytest.raises(TrainmemError, match="existing folder") as error:
        plot.write_timeline_plot(cpu_estimate, tmp_path / "no" / "t.png")
    assert error.value.where == "--plot"


def test_missing_matplotlib_names_the_extra(cpu_estimate, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    with pytest.raises(TrainmemError, match=re.escape("pip install 'trainmem[plot]'")):
        plot.write_timeline_plot(cpu_estimate, tmp_path / "t.png")


def test_peaks_plot_bars_and_capacity_lines(tmp_path):
    labels = ["batch=4", "batch=8", "batch=16"]
    series = {"allocated": [5 * GIB, 9 * GIB, 17 * GIB], "process": [6 * GIB, 10 * GIB, 19 * GIB]}
    capacities = {"rtx4090": 24 * GIB, "a100-40gb": 40 * GIB, "b200": 180 * GIB}
    figure = plot.peaks_figure(labels, series, capacities, "gpt2 sweep")
    axes = figure.axes[0]
    assert [c.get_label() for c in axes.containers] == list(series)
    for container, values in zip(axes.containers, series.values()):
        assert [bar.get_height() for bar in container] == values
    drawn = {line.get_gid(): line for line in axes.get_lines()}
    assert set(drawn) == {"capacity-rtx4090", "capacity-a100-40gb"}  # 180 GiB is > 3x the 19 GiB peak
    assert drawn["capacity-rtx4090"].get_linestyle() == "--"
    assert "b200 180.00 GiB" in axes.get_title()
    plot.write_peaks_plot(labels, series, capacities, tmp_path / "p.svg", "gpt2 sweep")
    svg = (tmp_path / "p.svg").read_text()
    assert '<g id="series-allocated"' in svg and '<g id="capacity-rtx4090"' in svg
    plot.write_peaks_plot(labels, series, capacities, tmp_path / "p.png", "gpt2 sweep")
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"


def test_peaks_plot_refuses_mismatched_series_and_extensions(tmp_path):
    with pytest.raises(TrainmemError, match=r"one value per configuration \(2\)") as error:
        plot.write_peaks_plot(["a", "b"], {"allocated": [1]}, {}, tmp_path / "p.png", "t", where="--sweep")
    assert error.value.where == "--sweep"
    with pytest.raises(TrainmemError, match=r"expected a \.png or \.svg file"):
        plot.write_peaks_plot(["a"], {"allocated": [1]}, {}, tmp_path / "p.jpg", "t")


def test_downsampled_timeline_keeps_the_peak_and_ticks_name_round_events(gpu_estimate):
    line = timeline(gpu_estimate, max_points=40)
    assert len(line.index) == 40 < line.events
    axes = plot.timeline_figure(gpu_estimate, max_points=40).axes[0]
    assert max(_lines(axes)["allocated"].get_ydata()) == line.peak_bytes == gpu_estimate.allocated_bytes
    positions = list(axes.get_xticks())
    events = [int(t.get_text().replace(",", "")) for t in axes.get_xticklabels()]
    assert positions == sorted(positions) and 0 <= positions[0] and positions[-1] <= len(line.index)
    assert all(event % 5 == 0 for event in events) and len(events) >= 4, events
    assert "drawn as 40 points" in axes.get_xlabel()


def test_event_ticks_place_an_event_inside_the_point_that_holds_it():
    from matplotlib import ticker  # noqa: F401 - the helper takes matplotlib's names as one object

    positions, labels = plot._event_ticks((0, 3, 6, 9), plot._matplotlib())
    where = dict(zip(labels, positions))
    assert where["0"] == 0 and where["6"] == 2 and where["9"] == 3
    assert all(abs(where[str(e)] - e / 3) < 1e-9 for e in range(10) if str(e) in where)
