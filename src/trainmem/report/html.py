"""The HTML report (`--html FILE`) and the notebook view (`Estimate._repr_html_`).

One self-contained file: the style sheet, the hover script and the timeline (inline SVG) are all in it and
it asks for nothing at view time (no CDN, fonts or images), so it opens offline. Sections: the summary
(the text report's header, the peaks, the verdict and the headroom), the timeline with its hover, the
memory each module owns at the peak as a collapsible tree, the breakdown, the process memory, how the
figures add up, and the assumptions and warnings.

A model is untrusted input: its module names, op names, its own name and every warning are escaped with
html.escape, the hover reads them from a JSON block in which `<`, `>` and `&` are \\u-escaped (so no
`</script>` can end it) and sets them with textContent only.
"""

from __future__ import annotations

import html
import json
import os
from typing import Any

from trainmem.errors import TrainmemError, quote, short
from trainmem.estimate.result import module_label
from trainmem.report.html_assets import CSS, JS
from trainmem.report.html_assets.svg import COLOURS, geometry, timeline_svg
from trainmem.report.palette import OTHER_COLOUR
from trainmem.report.style import PLAIN
from trainmem.report.text import alive_note, lean_loop_note, ranks_section, report_header, verdict, where_section
from trainmem.targets import words_for
from trainmem.units import format_bytes

WHERE = "--html"
SUFFIXES = (".html", ".htm")
# Points drawn: about two per pixel column of the 1000-unit-wide drawing in the report; half that in a
# notebook, whose output cell is saved inside the .ipynb (report/timeline.py keeps every bucket's highest).
PAGE_POINTS, NOTEBOOK_POINTS = 2000, 600


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _timeline_or_none(estimate: Any, max_points: int) -> tuple[Any, str]:
    """The estimate's timeline, or None and the one line that says why there is none."""
    from trainmem.report.timeline import timeline

    if getattr(estimate, "replay_input", None) is None:
        return None, "no timeline: this estimate keeps no allocator replay"
    return timeline(estimate, max_points=max_points), ""


def _allocated_name(estimate: Any) -> str:
    return words_for(estimate).allocated_label


# --- summary -------------------------------------------------------------------------------------------------

def _verdict(estimate: Any) -> str:
    """Fits or not, in the words of the text report's headline and --quiet (report/text.py verdict)."""
    fits, words = verdict(estimate)
    capacity = format_bytes(estimate.device.capacity_bytes)
    rank = " per rank" if getattr(estimate, "parallel", None) is not None else ""
    said = (f"fits {estimate.device.name} ({capacity}){rank}, {words}" if fits
            else f"DOES NOT FIT {estimate.device.name} ({capacity}){rank}: {words}")
    return f'<div class="verdict {"fits" if fits else "nofit"}">{_e(said)}</div>'


def _peak_rows(estimate: Any) -> list[tuple[str, int | None, str]]:
    words = words_for(estimate)
    rows = [("tensors (live storage)", estimate.tensor_bytes, "as requested"),
            ("allocated", estimate.allocated_bytes, words.allocated_note),
            ("reserved", estimate.reserved_bytes, words.reserved_note),
            (f"process ({words.process_counter})", estimate.process_bytes, "")]
    if estimate.process_bytes_high > estimate.process_bytes:
        rows.append(("process, high end", estimate.process_bytes_high, "the upper end of what real runs show"))
    return rows


def _summary(estimate: Any) -> str:
    head = [line.strip() for line in report_header(estimate, PLAIN)]  # the text report's header, same words
    rows = "".join(f'<tr><td>{_e(name)}</td><td class="num">{_e(format_bytes(value))}</td>'
                   f'<td class="num muted">{"" if value is None else f"{value:,} B"}</td>'
                   f'<td class="muted">{_e(note)}</td></tr>' for name, value, note in _peak_rows(estimate))
    where = f"Where: {where_section(estimate)}"
    lean = " ".join(line.strip() for line in lean_loop_note(estimate))
    ranks = [line for line in ranks_section(estimate) if line]  # many ranks: the text report's table of roles
    return (f"<h1>{_e(head[0] if head else estimate.model_name)}</h1>"
            f'<div class="setup">{_e(chr(10).join(head[1:]))}</div>'
            f"{_verdict(estimate)}<table><tr><th>peak memory</th><th class='num'>IEC</th>"
            f"<th class='num'>bytes</th><th></th></tr>{rows}</table><p>{_e(where)}</p>"
            + (f"<p>{_e(lean)}</p>" if lean else "")
            + (f'<pre class="ranks">{_e(chr(10).join(ranks))}</pre>' if ranks else ""))


# --- the timeline ----------------------------------------------------------------------------------------------

def _strings(values: tuple[str, ...]) -> tuple[list[str], list[int]]:
    """A table of the distinct strings and each point's position in it (names repeat over thousands of points)."""
    table: dict[str, int] = {}
    positions = [table.setdefault(value, len(table)) for value in values]
    return list(table), positions


def _point_data(t: Any, allocated_name: str) -> str:
    """The hover's data as JSON that is safe inside <script>: `<`, `>` and `&` are \\u-escaped."""
    phases, phase = _strings(t.phase)
    modules, module = _strings(tuple(module_label(m) for m in t.module))
    ops, op = _strings(t.op)
    data = {"geometry": geometry(), "events": t.events, "index": list(t.index), "step": list(t.step),
            "phases": phases, "phase": phase, "modules": modules, "module": module, "ops": ops, "op": op,
            "allocated_name": allocated_name, "allocated": list(t.allocated),
            "reserved": list(t.reserved) if t.reserved is not None else None,
            "categories": list(t.categories), "colours": {c: COLOURS.get(c, OTHER_COLOUR) for c in t.categories},
            "by_category": {c: list(v) for c, v in t.by_category.items()}, "peak": t.peak}
    text = json.dumps(data, separators=(",", ":"), ensure_ascii=False)
    return text.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")


def _process_note(estimate: Any) -> str:
    """The process figure the verdict judges, beside a drawing of the allocator alone."""
    words = words_for(estimate)
    held = getattr(estimate, words.allocator_holds)
    outside = estimate.process_bytes - (held or 0)
    if outside <= 0:
        return ""
    figure = words.process_counter
    return (f"process at the peak ({figure}): {format_bytes(estimate.process_bytes)}, of which "
            f"{format_bytes(outside)} is not the allocator's and not drawn (see Process memory below)")


def _timeline_section(estimate: Any, t: Any, interactive: bool) -> str:
    svg = timeline_svg(t, estimate.device.name, _allocated_name(estimate), interactive=interactive,
                       process_note=_process_note(estimate))
    hint = ("<p class='muted'>Hover for the op, module and live bytes at any point (or focus the chart and use "
            "← → and p for the peak). Bands: the phases of each traced step.</p>" if interactive else "")
    return f'<h2>Memory over the training step</h2>{hint}<div class="chart">{svg}</div>'


# --- modules at the peak ---------------------------------------------------------------------------------------

def _module_tree(owned: dict[str, int]) -> dict[str, Any]:
    """Nodes by qualified name ("" the model): own bytes, total (own + descendants), children names."""
    nodes: dict[str, dict[str, Any]] = {"": {"own": 0, "total": 0, "children": set()}}
    for name, nbytes in owned.items():
        parts = name.split(".") if name else []
        for depth in range(len(parts) + 1):
            path = ".".join(parts[:depth])
            node = nodes.setdefault(path, {"own": 0, "total": 0, "children": set()})
            node["total"] += nbytes
            if depth < len(parts):
                nodes.setdefault(".".join(parts[:depth + 1]), {"own": 0, "total": 0, "children": set()})
                node["children"].add(".".join(parts[:depth + 1]))
        nodes[name]["own"] += nbytes
    return nodes


def _natural(name: str) -> list[Any]:
    """A sort key that puts layers.2 before layers.10 (ties in bytes are common among repeated blocks)."""
    return [(0, int(part), "") if part.isdigit() else (1, 0, part) for part in name.split(".")]


def _tree_html(nodes: dict[str, Any], name: str, root_total: int, depth: int = 0) -> str:
    node = nodes[name]
    shown = module_label(name).rsplit(".", 1)[-1] if name else module_label(name)
    width = round(120 * node["total"] / root_total) if root_total else 0
    own = f" (own {format_bytes(node['own'])})" if node["children"] and node["own"] else ""
    line = (f'<span class="mname" title="{_e(module_label(name))}">{_e(shown)}</span>'
            f'<span class="bar" style="width:{width}px"></span>{_e(format_bytes(node["total"]))}'
            f'<span class="muted">{_e(own)}</span>')
    if not node["children"]:
        return f'<div class="leaf" data-module="{_e(name)}" data-bytes="{node["total"]}">{line}</div>'
    children = sorted(node["children"], key=lambda child: (-nodes[child]["total"], _natural(child)))
    inner = "".join(_tree_html(nodes, child, root_total, depth + 1) for child in children)
    return (f'<details data-module="{_e(name)}" data-bytes="{node["total"]}"{" open" if depth < 2 else ""}>'
            f"<summary>{line}</summary>{inner}</details>")


def _modules_section(t: Any) -> str:
    nodes = _module_tree(t.modules_at_peak)
    return ("<h2>Memory each module owns at the peak</h2><p class='muted'>Blocks alive at the peak, charged to the "
            "module whose op allocated them (parameters and optimizer state to the model, where they were made); "
            "each line is the module with everything under it, largest first.</p>"
            f'<div class="tree">{_tree_html(nodes, "", nodes[""]["total"])}</div>')


# --- tables and words ------------------------------------------------------------------------------------------

def _table(header: list[str], rows: list[list[str]], numeric: set[int], total: list[str] | None = None) -> str:
    cls = lambda i: ' class="num"' if i in numeric else ""  # noqa: E731
    head = "".join(f"<th{cls(i)}>{_e(h)}</th>" for i, h in enumerate(header))
    body = "".join("<tr>" + "".join(f"<td{cls(i)}>{c}</td>" for i, c in enumerate(row)) + "</tr>" for row in rows)
    foot = ('<tr class="total">' + "".join(f"<td{cls(i)}>{c}</td>" for i, c in enumerate(total)) + "</tr>"
            if total else "")
    return f"<table><tr>{head}</tr>{body}{foot}</table>"


def _breakdown_section(estimate: Any) -> str:
    total = getattr(estimate, words_for(estimate).breakdown_total)
    rows = [[f'<span class="swatch" style="background:{COLOURS.get(k, OTHER_COLOUR)}"></span>{_e(k)}', _e(format_bytes(v)),
             f"{v:,} B", f"{v / total:.1%}" if total else ""] for k, v in estimate.breakdown.items() if v]
    parts = [[_e(k), _e(format_bytes(v)), f"{v:,} B"] for k, v in estimate.process_parts.items()]
    process = f"Process memory ({words_for(estimate).process_counter})"
    out = ["<h2>Breakdown at the peak</h2>",
           _table(["category", "IEC", "bytes", "share"], rows, {1, 2, 3},
                  ["total", _e(format_bytes(total)), f"{total:,} B", ""]),
           *(f"<p>{_e(line.strip())}</p>" for line in alive_note(estimate)),
           f"<h2>{process}</h2>", _table(["part", "IEC", "bytes"], parts, {1, 2})]
    if estimate.allocator:
        a = estimate.allocator
        out.append("<h2>Caching allocator</h2><ul>"
                   f"<li>reserved but not allocated: {_e(format_bytes(a.fragmentation_at_allocated_peak))} at the "
                   f"allocated peak, {_e(format_bytes(a.fragmentation_at_reserved_peak))} at the reserved peak</li>"
                   f"<li>segments at the allocated peak: {a.segments_at_peak} (large "
                   f"{_e(format_bytes(a.large_segment_bytes_at_peak))}, small "
                   f"{_e(format_bytes(a.small_segment_bytes_at_peak))})</li></ul>")
    return "".join(out)


def _explanation_section(estimate: Any) -> str:
    ex = estimate.explanation
    rows = [[_e(r.what), _e(r.formula) + (f'<div class="muted">{_e(r.note)}</div>' if r.note else ""),
             f"{r.hand_bytes:,} B", f"{r.traced_bytes:,} B"] for r in ex.rows]
    out = ["<h2>How this adds up (by hand → traced)</h2>",
           _table(["what", "formula", "by hand", "traced"], rows, {2, 3})]
    if ex.differences:
        out.append("<ul>" + "".join(f"<li>{_e(d)}</li>" for d in ex.differences) + "</ul>")
    if estimate.baselines:
        out.append(f"<h2>Rules of thumb beside this estimate (vs {_e(estimate.baselines[0].vs)})</h2><ul>")
        for row in estimate.baselines:
            gap = f" ({row.relative_to_estimate:+.0%})" if row.relative_to_estimate is not None else ""
            out.append(f"<li>{_e(row.rule)}: {_e(format_bytes(row.bytes))}{gap} — {_e(row.why)}</li>")
        out.append("</ul>")
    return "".join(out)


def _warnings_section(estimate: Any) -> str:
    if not estimate.warnings:
        return "<h2>Assumptions and warnings</h2><p class='muted'>none</p>"
    return ("<h2>Assumptions and warnings</h2><ul class='warnings'>"
            + "".join(f"<li>{_e(w)}</li>" for w in estimate.warnings) + "</ul>")


# --- the page and the notebook view ----------------------------------------------------------------------------

def render_html(estimate: Any) -> str:
    """The whole report as one HTML document (TrainmemError where there is no timeline to draw)."""
    from trainmem import __version__

    t, why = _timeline_or_none(estimate, PAGE_POINTS)
    if t is None:
        raise TrainmemError("expected an estimate with its allocator replay (it draws the timeline), got one "
                            "that keeps none", where=WHERE)
    data = _point_data(t, _allocated_name(estimate))
    body = "".join([_summary(estimate), _timeline_section(estimate, t, interactive=True), _modules_section(t),
                    _breakdown_section(estimate), _explanation_section(estimate), _warnings_section(estimate)])
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            # no request of any kind: only inline styles and scripts may run, nothing may be fetched
            "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'; "
            "script-src 'unsafe-inline'\">"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            f"<title>{_e('trainmem — ' + estimate.model_name)}</title><style>{CSS}</style></head>"
            f'<body><main class="tm">{body}<p class="muted">trainmem {_e(__version__)} · this file fetches nothing; '
            f"it works offline</p></main>"
            f'<script type="application/json" id="tm-data">{data}</script><script>{JS}</script></body></html>\n')


def notebook_html(estimate: Any) -> str:
    """A notebook cell's view: the summary and the timeline as SVG, no script (Jupyter may not run one)."""
    t, why = _timeline_or_none(estimate, NOTEBOOK_POINTS)
    if t is None:  # no replay to draw: the text report
        return f'<div class="tm"><style>{CSS}</style><pre>{_e(str(estimate))}</pre><p class="muted">{_e(why)}</p></div>'
    return (f'<div class="tm"><style>{CSS}</style>{_summary(estimate)}'
            f"{_timeline_section(estimate, t, interactive=False)}</div>")


def write_html(estimate: Any, path: str | os.PathLike) -> None:
    """Write the report to `path` (.html or .htm); a bad name or a folder that cannot take it is one line."""
    name = os.fspath(path)
    if not isinstance(name, str) or not name.lower().endswith(SUFFIXES):
        raise TrainmemError(f"expected a file name ending in .html or .htm, got {quote(name)}", where=WHERE)
    folder = os.path.dirname(os.path.abspath(name))
    if not os.path.isdir(folder):
        raise TrainmemError(f"expected a file in an existing folder, got {quote(name)} ({short(folder)} does "
                            "not exist)", where=WHERE)
    if os.path.isdir(name):
        raise TrainmemError(f"expected a file name, got the folder {quote(name)}", where=WHERE)
    page = render_html(estimate)
    try:
        with open(name, "w", encoding="utf-8") as handle:
            handle.write(page)
    except OSError as error:  # no permission, a read-only file system, a full disk
        raise TrainmemError(f"expected a writable file, could not write {quote(name)}: "
                            f"{error.strerror or error}", where=WHERE) from None
