"""When a model's repeated blocks are traced a few and the rest composed (trace/block_compose.py), and the check
made on every use.

A PyTorch model with at least MIN_BLOCKS repeated blocks (trace/block_variants.py: alike in type, parameter
shapes and every plain setting, and no per-block list in its config) is traced cut to 3 blocks and to 4. The
3-block trace composed to 4 blocks must equal the 4-block trace event for event, storage for storage and kernel
call for kernel call (block_check.first_difference); then the 3-block trace composed to all L blocks is the
model's trace. Anything else — a difference, a trace the composition refuses — and the model is traced whole,
which the report says with the reason. What the check cannot see is a block that behaves differently only
beyond the fourth because of its index (a forward that reads `self.layer_idx` to pick its attention); the
settings check refuses the models where that index reaches a setting or a per-block list of the config.

Blocks that alternate with a period p (Gemma-2's sliding and global layers: p = 2; block_variants.block_period)
compose the same way in runs of p blocks: traced cut to 3p and 4p blocks, where the whole model has at least
MIN_BLOCKS runs.

Op counts are the 4-block counts plus each op's count per block (4 minus 3) for every further block, and so are
the numbers in the traces' notes (extrapolated_notes).
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
from collections.abc import Callable, Iterator
from typing import Any

from trainmem.trace.block_check import extrapolated_counts, extrapolated_marks, first_difference
from trainmem.trace.block_compose import NotComposable, Stack, compose, composed_names
from trainmem.trace.traced import TraceResult

MIN_BLOCKS = 16  # below, tracing 3 and 4 blocks costs about what tracing the whole model does: 12-block GPT-2
# and BERT-base estimates took 0.99x and 1.03x as long composed (benchmarks/results/block_reuse.md, MIN_BLOCKS lowered)
TRACED = (3, 4)  # block counts traced: 3 has a middle block (block_compose.TEMPLATE) before the last
_state = {"on": True}


@contextlib.contextmanager
def whole_models() -> Iterator[None]:
    """Every model traced whole inside (the tests and benchmarks that hold composed traces to whole ones)."""
    before, _state["on"] = _state["on"], False
    try:
        yield
    finally:
        _state["on"] = before


@dataclasses.dataclass(frozen=True)
class Reuse:
    traced: TraceResult | None  # the composed trace (None: trace the model whole)
    note: str = ""  # what the report says about it ("" when the model has no stack of blocks to compose)


def traced_by_blocks(model: Any, setup: Any, trace_model: Callable[[Any], TraceResult]) -> Reuse:
    """The model's trace composed from its 3- and 4-block variants (3 and 4 runs of unlike blocks where the blocks
    alternate), or why it is traced whole."""
    from trainmem.trace.block_variants import block_period, repeated_blocks, with_blocks

    found = repeated_blocks(model)
    if not _state["on"] or found is None or found.count < MIN_BLOCKS or setup.compile:
        return Reuse(None)
    whole = f"{found.count} blocks of {found.path} traced whole"
    period, why = block_period(model, found, MIN_BLOCKS)  # as many runs of `period` blocks as blocks without one
    if why is not None:
        return Reuse(None, f"{whole}: {why}")
    few, more = (trace_model(with_blocks(model, found.path, k * period)) for k in TRACED)
    if few.quantized_parameters:
        return Reuse(None, f"{whole}: 4-bit weights are not composed")
    few_blocks, more_blocks = (k * period for k in TRACED)
    try:
        per_block_runs, difference = _checked(few, more, found.path, period)
        if difference is not None:
            return Reuse(None, f"{whole}: {few_blocks} blocks composed to {more_blocks} differ from {more_blocks} "
                               f"traced ({difference})")
        composed = _composed(model, Stack(found.path, TRACED[0], found.count // period, period), few, more,
                             per_block_runs)
    except NotComposable as error:
        return Reuse(None, f"{whole}: {error}")
    alike = "" if period == 1 else f", alike every {period}"
    template = "block 1's events" if period == 1 else f"the events of blocks {period}-{2 * period - 1}"
    note = (f"{found.count} blocks of {found.path}{alike}: the model traced with {few_blocks} and {more_blocks} of "
            f"them, the other {found.count - few_blocks} composed from {template} (checked: {few_blocks} composed to "
            f"{more_blocks} equal {more_blocks} traced, event for event)")
    return Reuse(dataclasses.replace(composed, warnings=composed.warnings + [note]), note)


def _checked(few: TraceResult, more: TraceResult, path: str, period: int) -> tuple[bool, str | None]:
    """(per_block_runs, None) for the first rule set under which the 3-block trace composes to the 4-block one event for
    event (block_compose.py: the plain rules, then with 5.); else (False, where the plain rules differ). Raises the
    plain rules' NotComposable when neither composes."""
    differences: list[str | None] = []
    refused: NotComposable | None = None
    for per_block_runs in (False, True):
        try:
            trace, _, _ = compose(few.trace, Stack(path, TRACED[0], TRACED[1], period), few.checkpointed,
                                  few.output_elements, per_block_runs)
        except NotComposable as error:
            refused = refused or error
            continue
        differences.append(first_difference(trace, more.trace))
        if differences[-1] is None:
            return per_block_runs, None
    if not differences:  # both rule sets refused: the plain rules' reason
        raise refused
    return False, differences[0]


def _composed(model: Any, stack: Stack, few: TraceResult, more: TraceResult, per_block_runs: bool) -> TraceResult:
    """The whole model's trace from its 3-block (`few`) and 4-block (`more`) traces: the events composed, what is
    counted extrapolated (op counts, the lean loop's counts, notes), a rank's module sets renamed."""
    trace, checkpointed, outputs = compose(few.trace, stack, few.checkpointed, few.output_elements, per_block_runs)
    steps = stack.total - TRACED[1]
    trace.loop_marks = extrapolated_marks(trace.loop_marks, few.trace.loop_marks, more.trace.loop_marks, steps)
    resolved = dict(more.resolved)
    if resolved.get("lora") is not None:  # the adapters of every block, not of the 4 traced
        from trainmem.trace.finetune import lora_used

        resolved["lora"] = lora_used(model)
    return dataclasses.replace(
        more, trace=trace, checkpointed=checkpointed, output_elements=outputs, resolved=resolved,
        op_counts=extrapolated_counts(few.op_counts, more.op_counts, steps),
        warnings=extrapolated_notes(few.warnings, more.warnings, steps),
        parallel_notes=extrapolated_notes(few.parallel_notes, more.parallel_notes, steps),
        # a rank's own modules and buffer shards (one process takes the whole model's, trace/run.py)
        parameter_modules=set(composed_names(sorted(few.parameter_modules), stack)),
        leaf_modules=set(composed_names(sorted(few.leaf_modules), stack)),
        buffer_bytes=more.buffer_bytes + steps * (more.buffer_bytes - few.buffer_bytes))


_NUMBER = re.compile(r"\d{1,3}(?:,\d{3})+|\d+")  # 1,234 or 42


def extrapolated_notes(fewer: list[str], more: list[str], steps: int) -> list[str]:
    """The notes of the composed trace: a note that counts something per block ("scaled_dot_product_attention ×8")
    has, in the 3- and 4-block traces, the same numbers in the same places; each number that differs is
    extrapolated `steps` blocks beyond `more`, in the 4-block note's words (a list of blocks cut short, "blocks.0,
    blocks.1, blocks.2, …", reads the same from 4 blocks on). Notes with other numbers do not compose."""
    if len(fewer) != len(more):
        raise NotComposable("the traces' notes differ")
    out = []
    for few, many in zip(fewer, more):
        if len(_NUMBER.findall(few)) != len(_NUMBER.findall(many)):
            raise NotComposable(f"the note {many!r} is not the 3-block trace's")
        grown = [_grown(a, b, steps) for a, b in zip(_NUMBER.findall(few), _NUMBER.findall(many))]
        pieces = _NUMBER.split(many)
        out.append("".join(piece + number for piece, number in zip(pieces, grown + [""])))
    return out


def _grown(few: str, many: str, steps: int) -> str:
    if few == many:
        return many
    a, b = int(few.replace(",", "")), int(many.replace(",", ""))
    value = b + steps * (b - a)
    return f"{value:,}" if "," in many or "," in few else str(value)
