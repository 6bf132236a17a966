"""The terminal report's layout (report/text.py, report/style.py): colour only on a terminal and never with
NO_COLOR, aligned columns in IEC units, the --quiet line agreeing with Estimate.fits, and the sentence that says
which activations the breakdown counts at the peak."""

import dataclasses
import io
import os
import re

import pytest

import trainmem
from trainmem.report.style import Style, strip_colour, table, use_colour, visible_len
from trainmem.report.text import render_quiet, render_text
from trainmem.units import format_bytes

SIZE = re.compile(r"-?\d[\d.,]* (B|KiB|MiB|GiB|TiB)\b|n/a")


@pytest.fixture(scope="module")
def est():
    """A real estimate (CPU, the seed MLP at a small batch): the peak is in step 1's inputs phase."""
    return trainmem.estimate("mlp:64-32-32-10", batch_size=8, optimizer="adam", input_shape="64")


@pytest.fixture
def tty():
    """A real terminal (a pseudo-terminal pair), so isatty() is the operating system's answer."""
    leader, follower = os.openpty()
    stream = os.fdopen(follower, "w")
    yield stream
    stream.close()
    os.close(leader)


# ---- colour ----------------------------------------------------------------------------------------


def test_colour_on_a_terminal_only(tty, monkeypatch):
    monkeypatch.delenv("NO_COLOR", raising=False)
    assert use_colour(tty) is True
    assert use_colour(io.StringIO()) is False  # a pipe, a file, a capture
    assert use_colour(object()) is False  # no isatty at all
    closed = io.StringIO()
    closed.close()
    assert use_colour(closed) is False


@pytest.mark.parametrize("value", ["1", "0", "false", "yes"])
def test_no_color_any_non_empty_value_turns_colour_off(tty, monkeypatch, value):
    monkeypatch.setenv("NO_COLOR", value)  # no-color.org: present and not empty, whatever it says
    assert use_colour(tty) is False


def test_no_color_empty_is_not_set(tty, monkeypatch):
    monkeypatch.setenv("NO_COLOR", "")
    assert use_colour(tty) is True


def test_report_is_plain_by_default_and_colour_changes_no_layout(est):
    plain = render_text(est)
    assert plain == str(est) and "\x1b" not in plain
    coloured = render_text(est, colour=True)
    assert "\x1b[" in coloured and coloured != plain
    assert strip_colour(coloured) == plain  # the same columns, only painted


def test_coloured_cells_align_like_plain_ones():
    paint = Style(True)
    rows = [["fits", paint.good("1.00 GiB")], ["over", "12.50 MiB"]]
    lines = table(rows, "lr")
    assert [visible_len(line) for line in lines] == [len(line) for line in table([["fits", "1.00 GiB"],
                                                                                   ["over", "12.50 MiB"]], "lr")]
    assert strip_colour(lines[0]).endswith(" 1.00 GiB") and lines[1].endswith("12.50 MiB")


def test_plain_style_returns_text_unchanged():
    style = Style(False)
    assert all(f("x") == "x" for f in (style.heading, style.strong, style.good, style.bad, style.warn, style.dim))


# ---- columns and units ------------------------------------------------------------------------------


def _section(text: str, title: str) -> list[str]:
    lines = text.splitlines()
    start = lines.index(title) + 1
    end = next(i for i in range(start, len(lines)) if not lines[i].startswith("  ") or not lines[i].strip())
    return lines[start:end]


@pytest.mark.parametrize("title", ["Peak memory", "Breakdown at the peak", "Process memory (peak RSS)"])
def test_sizes_right_aligned_in_iec_units(est, title):
    rows = [line for line in _section(render_text(est), title) if not line.startswith("  The breakdown counts")]
    assert len(rows) >= 2
    ends = set()
    for line in rows:
        first = SIZE.search(line)
        assert first, line
        assert first.group(0) == "n/a" or first.group(1) in ("B", "KiB", "MiB", "GiB", "TiB")
        ends.add(first.end())
    assert len(ends) == 1, rows  # every figure ends in the same column: units line up


def test_peak_rows_give_iec_and_exact_bytes(est):
    peak = _section(str(est), "Peak memory")
    tensors = next(line for line in peak if line.startswith("  tensors (live storage)"))
    assert format_bytes(est.tensor_bytes) in tensors and f"{est.tensor_bytes:,} B" in tensors
    process = next(line for line in peak if line.startswith("  process (peak RSS)"))
    free = est.device.capacity_bytes - est.process_bytes
    assert f"of {format_bytes(est.device.capacity_bytes)}: fits, {format_bytes(free)} free" in process
    if est.process_bytes_high > est.process_bytes:
        high = next(line for line in peak if line.startswith("  process, high end"))
        assert format_bytes(est.process_bytes_high) in high


def test_every_fact_of_the_explanation_stays(est):
    text = str(est)
    for row in est.explanation.rows:
        assert row.formula in text and f"= {row.hand_bytes:,} B" in text
        assert format_bytes(row.traced_bytes) in text
        if row.traced_bytes != row.hand_bytes:
            assert f"traced {row.traced_bytes:,} B" in text
    assert all(note in text for note in est.explanation.differences)
    assert all(b.rule in text and b.why in text for b in est.baselines)
    assert all(w in text for w in est.warnings)


# ---- the one-line answer -----------------------------------------------------------------------------


def test_quiet_fits_on_the_cpu(est):
    free = est.device.capacity_bytes - est.process_bytes
    line = render_quiet(est)
    assert est.fits and "\n" not in line
    assert line.startswith(f"peak {format_bytes(est.process_bytes)} (fits cpu RAM, {format_bytes(free)} free)")
    if est.process_bytes_high > est.process_bytes:
        assert line.endswith(f"; high end {format_bytes(est.process_bytes_high)}")


def test_quiet_does_not_fit_says_by_how_much(est):
    over = dataclasses.replace(est, process_bytes=est.device.capacity_bytes + 3 * 2**30, process_bytes_high=None)
    assert not over.fits
    assert render_quiet(over) == f"peak {format_bytes(over.process_bytes)} (does not fit cpu RAM: 3.00 GiB over)"
    assert "DOES NOT FIT, 3.00 GiB over" in str(over)


def test_quiet_agrees_with_fits_when_the_allocator_ran_out(est):
    refused = dataclasses.replace(est, fits_override=False)
    assert not refused.fits and refused.process_bytes <= refused.device.capacity_bytes
    assert "does not fit cpu RAM: the simulated allocator runs out of memory" in render_quiet(refused)
    assert "DOES NOT FIT" in str(refused)


def test_quiet_distributed_is_per_rank(est):
    from trainmem.estimate.result import RankEstimate

    peak = {"tensor_bytes": 1, "process_bytes": est.process_bytes, "reserved_bytes": None}
    roles = (RankEstimate("pp stage 0", (0,), peak, {}, {}), RankEstimate("pp stage 1", (1,), peak, {}, {}))
    parallel = {"most_loaded": {"label": "pp stage 1", "rank": 1}}
    many = dataclasses.replace(est, ranks=roles, parallel=parallel)
    assert render_quiet(many).startswith(f"peak {format_bytes(est.process_bytes)} per rank (most loaded: pp stage 1; "
                                         "fits cpu RAM, ")
    one_role = dataclasses.replace(est, ranks=roles[:1], parallel={"most_loaded": {"label": "all ranks", "rank": 0}})
    assert render_quiet(one_role).startswith(f"peak {format_bytes(est.process_bytes)} per rank (fits cpu RAM, ")


# ---- which activations the breakdown counts ------------------------------------------------------------


def _saved(est) -> int:
    return est.explanation.saved_activation_bytes - est.explanation.saved_by_op.get("inputs (the batch)", 0)


def _note(est) -> list[str]:
    return [line for line in str(est).splitlines() if line.startswith("  The breakdown counts")]


def test_note_after_backward_names_what_was_freed(est):
    # the fixture's real peak: step 1's optimizer step, after backward freed most of what forward saved
    saved, alive = _saved(est), est.breakdown["activations"]
    assert est.peak_phase == "optimizer" and 0 < alive < saved
    [note] = _note(est)
    assert f"at the peak (optimizer, op {est.peak_op}): {format_bytes(alive)} of the {format_bytes(saved)} of " \
           "activations forward saves for backward (the activations row below, less the batch)" in note
    assert f"the other {format_bytes(saved - alive)} was freed before it." in note


def test_note_before_the_forward(est):
    early = dataclasses.replace(est, peak_phase="inputs")
    [note] = _note(early)
    assert f"{format_bytes(est.breakdown['activations'])} of activations, where forward saves " \
           f"{format_bytes(_saved(est))} for backward" in note
    assert "before this step's forward saves them: those alive are the previous step's" in note
    during = dataclasses.replace(est, peak_phase="forward")
    assert "before forward and the loss have saved them all" in _note(during)[0]


def test_note_when_more_are_alive_than_forward_saved(est):
    more = dataclasses.replace(est, peak_phase="backward", breakdown={**est.breakdown, "activations": 2 * _saved(est)})
    [note] = _note(more)
    assert "more than the" in note and "recomputed under checkpointing" in note


def test_no_note_when_the_totals_agree(est):
    same = dataclasses.replace(est, breakdown={**est.breakdown, "activations": _saved(est)})
    assert _note(same) == []


def test_other_renderers_keep_the_shared_table():
    from trainmem.report import keras_text, style, text

    assert keras_text.table is style.table and text.table is style.table
    assert text.table([["a", "1 B"], ["bb", "10 B"]], "lr") == ["  a    1 B", "  bb  10 B"]


def test_an_estimate_with_its_own_report_keeps_it(est):
    """cli.py calls render_text(result, colour=True) on a terminal: a subclass with its own report must still print
    that one, and so must an estimate with a framework section (Keras on TensorFlow's report)."""
    import dataclasses as dc

    from trainmem.estimate.result import Estimate

    @dc.dataclass(frozen=True)
    class Own(Estimate):
        def __str__(self) -> str:
            return "its own report"

    own = Own(**{f.name: getattr(est, f.name) for f in dc.fields(Estimate)})
    assert render_text(own, colour=True) == "its own report"

    class Section:
        def to_json(self) -> dict:
            return {"framework": {"name": "other"}}

        def render(self, estimate) -> str:
            return f"the section's report of {estimate.model_name}"

    with_section = dc.replace(est, framework=Section())
    assert render_text(with_section, colour=True) == str(with_section) == f"the section's report of {est.model_name}"
    assert with_section.to_dict()["framework"] == {"name": "other"} and "framework" not in est.to_dict()
