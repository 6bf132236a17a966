"""When a model's repeated blocks are traced a few and the rest composed (trace/block_compose.py), and the check
made on every use.

A PyTorch model with at least MIN_BLOCKS repeated blocks (trace/block_variants.py: alike in type, parameter
shapes and every plain setting, and no per-block list in its config) is traced cut to 3 blocks and to 4. The
3-block trace composed to 4 blocks must equal the 4-block trace event for event, storage for storage and kernel
call for kernel call (block_compose.first_difference); then the 3-block trace composed to all L blocks is the
model's trace. Anything else — a difference, a trace the composition refuses — and the model is traced whole,
which the report says with the reason. What the check cannot see is a block that behaves differently only
beyond the fourth because of its index (a forward that reads `self.layer_idx` to pick its attention); the
settings check refuses the models where that index reaches a setting or a per-block list of the config.

Op counts are the 4-block counts plus each op's count per block (4 minus 3) for every further block.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

from trainmem.trace.block_compose import (NotComposable, Stack, compose, composed_names, extrapolated_counts,
                                          extrapolated_marks, extrapolated_notes, first_difference)
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
    """The model's trace composed from its 3- and 4-block variants, or why it is traced whole."""
    from trainmem.trace.block_variants import differing_settings, repeated_blocks, with_blocks

    found = repeated_blocks(model)
    if not _state["on"] or found is None or found.count < MIN_BLOCKS or setup.compile:
        return Reuse(None)
    whole = f"{found.count} blocks of {found.path} traced whole"
    why = differing_settings(model, found)
    if why is not None:
        return Reuse(None, f"{whole}: {why}")
    few, more = (trace_model(with_blocks(model, found.path, k)) for k in TRACED)
    if few.quantized_parameters:
        return Reuse(None, f"{whole}: 4-bit weights are not composed")
    try:
        per_block_runs, difference = _checked(few, more, found.path)
        if difference is not None:
            return Reuse(None, f"{whole}: {TRACED[0]} blocks composed to {TRACED[1]} differ from {TRACED[1]} traced "
                               f"({difference})")
        composed = _composed(model, Stack(found.path, TRACED[0], found.count), few, more, per_block_runs)
    except NotComposable as error:
        return Reuse(None, f"{whole}: {error}")
    note = (f"{found.count} blocks of {found.path}: the model traced with {TRACED[0]} and {TRACED[1]} of them, the "
            f"other {found.count - TRACED[0]} composed from block 1's events (checked: {TRACED[0]} composed to "
            f"{TRACED[1]} equal {TRACED[1]} traced, event for event)")
    return Reuse(dataclasses.replace(composed, warnings=composed.warnings + [note]), note)


def _checked(few: TraceResult, more: TraceResult, path: str) -> tuple[bool, str | None]:
    """(per_block_runs, None) for the first rule set under which the 3-block trace composes to the 4-block one event for
    event (block_compose.py: the plain rules, then with 5.); else (False, where the plain rules differ)."""
    differences = []
    for per_block_runs in (False, True):
        trace, _, _ = compose(few.trace, Stack(path, TRACED[0], TRACED[1]), few.checkpointed, few.output_elements,
                              per_block_runs)
        differences.append(first_difference(trace, more.trace))
        if differences[-1] is None:
            return per_block_runs, None
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
