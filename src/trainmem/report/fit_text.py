"""`trainmem fit`'s text: the answer first (the largest batch or sequence that fits, its high estimate, the headroom
it keeps), then the candidates that decided it: the answer, the fitting one below it and the first that did not
fit (with `verbose`, every candidate evaluated), and a line for each candidate that needs less than the one below
it, saying what the two estimates show about why. Then how a candidate was judged. The result is fit.py's
FitResult; the JSON (FitResult.to_dict) keeps every candidate whatever the text shows."""

from __future__ import annotations

from typing import Any

from trainmem.units import format_bytes

MAX_DROPS = 2  # candidates needing less than the one below them, explained without --verbose
ANSWER_MARK = "← the answer"

# the process figure's parts (targets/: process_parts) in words, for a drop the trace and allocator do not explain
PART_WORDS = {
    "tensor_heap_resident": "glibc keeps freed blocks under its mmap threshold in the heap and returns larger, "
                            "mmapped ones, so a larger batch can leave less resident",
    "process_floor": "the process floor (libraries, threads) is sized with the run",
}


def render(result: Any, verbose: bool = False) -> str:
    """The text of a FitResult; `verbose` lists every candidate evaluated."""
    lines = [f"trainmem fit — {result.device_name} ({format_bytes(result.capacity)}), searching the {result.dimension}"]
    lines += _answer(result) if result.best is not None else _remedies(result)
    shown = candidates_shown(result, verbose)
    lines += [""] + [_row(result, value) for value in shown]
    hidden = len(result.tried) + len(result.failed) - len(shown)
    if hidden:
        lines.append(f"  ({hidden} more candidate{'s' if hidden > 1 else ''} evaluated: --verbose lists every one, "
                     "--format json too)")
    found = drops(result)
    lines += [drop_line(result, smaller, larger) for smaller, larger in (found if verbose else found[:MAX_DROPS])]
    if len(found) > MAX_DROPS and not verbose:
        lines.append(f"  ({len(found) - MAX_DROPS} more such candidates: --verbose explains each)")
    if result.failed:
        lines.append(f"  ({result.dimension} {', '.join(f'{v:,}' for v, _ in result.failed)} failed to evaluate: the "
                     "answer rests on the candidates evaluated; one above it may fit)")
    lines += ["", f"  a candidate fits when {result.compared} ≤ {format_bytes(result.budget)}, "
                  f"keeping a {result.margin.fraction:.0%} margin", f"  margin from {result.margin.source}"]
    if result.search:
        lines.append(f"  candidates {result.search['how']}")
    return "\n".join(lines)


def candidates_shown(result: Any, verbose: bool = False) -> list[int]:
    """Every candidate with `verbose`; else those that decided the answer: the answer, the fitting one below it,
    the first that did not fit, the candidates of the drops explained, and the failures."""
    if verbose:
        return sorted([value for value, *_ in result.tried] + [value for value, _ in result.failed])
    keep = {value for value, _ in result.failed}
    if result.best is not None:
        below = [value for value, _, _, fits in result.tried if fits and value < result.best]
        keep |= {result.best, *([max(below)] if below else [])}
    if result.first_miss is not None:
        keep.add(result.first_miss)
    for pair in drops(result)[:MAX_DROPS]:
        keep |= set(pair)
    return sorted(keep)


def _row(result: Any, value: int) -> str:
    failed = dict(result.failed)
    if value in failed:
        text = f"failed: {failed[value]}"
    else:
        _, high, fits = next((b, h, f) for v, b, h, f in result.tried if v == value)
        text = f"{format_bytes(high):>11s}  {'fits' if fits else 'does not fit'}"
        text += f"  {ANSWER_MARK}" if value == result.best else ""
    return f"  {result.dimension} {value:>8,}: {text}"


def drops(result: Any) -> list[tuple[int, int]]:
    """(smaller, larger) for each two candidates next to each other among those evaluated where the larger's high
    estimate is below the smaller's."""
    rows = sorted((value, high) for value, _, high, _ in result.tried)
    return [(a, b) for (a, high_a), (b, high_b) in zip(rows, rows[1:]) if high_b < high_a]


def drop_line(result: Any, smaller: int, larger: int) -> str:
    """One line: the larger candidate needs less, and what the two estimates show about why."""
    high = {value: h for value, _, h, _ in result.tried}
    return (f"  {result.dimension} {larger:,} needs less than {smaller:,} ({format_bytes(high[larger])} vs "
            f"{format_bytes(high[smaller])}, high): {why_less(result.peaks.get(smaller), result.peaks.get(larger))}")


def why_less(a: Any, b: Any) -> str:
    """Why candidate b (the larger) can need less than a (CandidatePeak each): the traced step holds fewer tensors
    at its peak, or the allocator rounds and keeps less, or a part of the process figure is smaller."""
    if a is None or b is None:
        return ("memory need not grow with every step of the size: a kernel can take another path, the allocator "
                "rounds and splits blocks differently")
    if b.tensor_bytes < a.tensor_bytes:
        where = (f"its peak moves from {a.phase} (op {a.op}) to {b.phase} (op {b.op})" if (a.phase, a.op) !=
                 (b.phase, b.op) else f"the peak stays in {b.phase} (op {b.op})")
        return (f"the traced step holds fewer tensor bytes at its peak ({format_bytes(b.tensor_bytes)} vs "
                f"{format_bytes(a.tensor_bytes)}): {where}; a kernel can take another path at another size "
                "(another algorithm, a workspace sized by the shape)")
    allocator = _allocator_reason(a, b)
    if allocator:
        return allocator
    if b.process_bytes >= a.process_bytes:
        return (f"its expected figure does not drop ({format_bytes(b.process_bytes)} vs "
                f"{format_bytes(a.process_bytes)}); only the high estimate's allowance above it is smaller")
    part = min(set(a.process_parts) & set(b.process_parts),
               key=lambda name: b.process_parts[name] - a.process_parts[name], default=None)
    if part is None or b.process_parts[part] >= a.process_parts[part]:
        return "the process figure's parts other than the traced tensors are smaller at this size"
    return (f"the process's {part.replace('_', ' ')} is smaller ({format_bytes(b.process_parts[part])} vs "
            f"{format_bytes(a.process_parts[part])})" + (f": {PART_WORDS[part]}" if part in PART_WORDS else ""))


def _allocator_reason(a: Any, b: Any) -> str:
    """The caching allocator's part of a drop: fewer bytes reserved in its segments, or fewer allocated once
    blocks are rounded, though the traced tensors are as many or more."""
    if a.reserved_bytes is not None and b.reserved_bytes is not None and b.reserved_bytes < a.reserved_bytes:
        known = b.segments is not None and a.segments is not None
        return (f"its tensors hold as much or more ({format_bytes(b.tensor_bytes)} vs {format_bytes(a.tensor_bytes)}), "
                f"but the caching allocator reserves less ({format_bytes(b.reserved_bytes)}"
                f"{f' in {b.segments} segments' if known else ''} vs {format_bytes(a.reserved_bytes)}"
                f"{f' in {a.segments}' if known else ''}): it rounds blocks and splits or reuses its segments differently "
                "at each size, so a smaller one can leave a free block too small for a later request")
    if a.allocated_bytes is not None and b.allocated_bytes is not None and b.allocated_bytes < a.allocated_bytes:
        return (f"its tensors hold as much or more, but once the allocator rounds their blocks it allocates less "
                f"({format_bytes(b.allocated_bytes)} vs {format_bytes(a.allocated_bytes)})")
    return ""


def _answer(result: Any) -> list[str]:
    est = result.best_estimate
    lines = [f"Largest {result.dimension} that fits: {result.best:,} — peak {format_bytes(est.process_bytes_high)} "
             f"(high estimate; expected {format_bytes(est.process_bytes)}) of {format_bytes(result.capacity)}, headroom "
             f"{format_bytes(result.headroom)} ({result.headroom / result.capacity:.1%}; the margin asks for "
             f"{result.margin.fraction:.0%})",
             f"  peak in {est.peak_phase} (op {est.peak_op}); at the peak: "
             + ", ".join(f"{k} {format_bytes(v)}" for k, v in est.breakdown.items() if v)]
    if result.first_miss is None and result.failed:
        return lines
    if result.first_miss is None:
        return lines + [f"  (the search stopped at its limit, {max(v for v, *_ in result.tried):,}, which still fits)"]
    miss = result.miss_estimate.process_bytes_high
    over = (f"{format_bytes(miss - result.capacity)} over the capacity" if miss > result.capacity else
            f"{format_bytes(miss - result.budget)} over the margin, {format_bytes(result.capacity - miss)} under the "
            "capacity")
    return lines + [f"  {result.dimension} {result.first_miss:,} needs {format_bytes(miss)} (high): {over}"]


def _remedies(result: Any) -> list[str]:
    dimension, budget = result.dimension, result.budget
    base = result.tried[0][2]
    why = (f"its high estimate {format_bytes(base)} exceeds {format_bytes(budget)}" if base > budget
           else "the simulated caching allocator runs out of memory")
    lines = [f"Even {dimension} 1 does not fit: {why}. What to change first (high estimate and saving "
             f"at {dimension} 1):"]
    for remedy in sorted(result.remedies, key=lambda r: (bool(r.error), r.process_bytes_high)):
        if remedy.error:
            lines.append(f"  - {remedy.what}: failed to evaluate — {remedy.error}")
            continue
        verdict = "fits" if remedy.process_bytes_high <= budget else "still does not fit"
        lines.append(f"  - {remedy.what}: {format_bytes(remedy.process_bytes_high)} "
                     f"(saves {format_bytes(remedy.saving(base))}; {verdict}) — {remedy.how}")
    return lines
