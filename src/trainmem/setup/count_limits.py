"""The bounds of a training setup's counts (batch size, micro-batches per step, steps traced and run, sequence
length), checked as a TrainingSetup is built, so that a typo fails on one line before anything is traced. No torch.
"""

from __future__ import annotations

import math
from typing import Any

from trainmem.errors import SetupError, expected, one_line

# A tensor's element count is an int64 in c10 (TensorImpl::numel_): a batch of more elements cannot be
# made, and torch fails while unpacking the size. A batch size beyond it is a typo, not a plan.
MAX_ELEMENTS = 2**63 - 1
# The same int64 bounds a tensor's bytes (c10 computeStorageNbytes) and TensorFlow's shapes: a batch can pass the
# element check and still overflow in the model, where an activation is wider than the input or holds 4-byte
# elements. Torch and TensorFlow then fail with these words, naming no flag (trace/run.py, trace/tf/keras_graph.py).
OVERFLOW_WORDS = ("Storage size calculation overflowed", "more than 2**63 - 1 entries")
# The trace runs every micro-batch of a step (trace/loops.py), each a full forward and backward. Real
# runs accumulate up to a few hundred micro-batches (a global batch of 1,024 from micro-batches of 1 on
# 8 GPUs is 128); 1,024 covers them with room, and tracing more would take minutes to say the same.
MAX_GRAD_ACCUM = 1024
# The run's length (--steps, run_steps) and the steps traced (steps): the CPU heap's growth is replayed over
# the run (alloc/steady_state.py: 32 steps by default, and never more events than a bounded replay holds, a few
# hundred steps of a small model), and `trainmem measure` runs that
# many real steps in each fresh process. 1,000 is far past where a heap still grows; a million is a typo that
# would measure for hours.
MAX_RUN_STEPS = 1000
# Steps traced on fake tensors (--trace-steps, hidden): each is a whole forward, backward and optimizer step,
# seconds for a large model; two are enough, the later ones are composed from them (alloc/steady_state.py).
# 16 leaves room to check that composition against a longer real trace (tests/test_steady_state.py).
MAX_TRACE_STEPS = 16


def check_counts(batch_size: Any, grad_accum: Any, steps: Any, run_steps: Any, seq_len: Any) -> None:
    """A TrainingSetup's counts: each a positive integer within its bound; run_steps and seq_len may be None."""
    _check_positive_int(batch_size, "--batch-size")
    _check_positive_int(grad_accum, "--grad-accum")
    if batch_size > MAX_ELEMENTS:
        raise expected(f"a batch size within a tensor's int64 element count ({MAX_ELEMENTS:,})", batch_size,
                       "--batch-size")
    if grad_accum > MAX_GRAD_ACCUM:
        raise expected(f"at most {MAX_GRAD_ACCUM:,} micro-batches per optimizer step", grad_accum, "--grad-accum")
    _check_positive_int(steps, "--trace-steps")
    if steps > MAX_RUN_STEPS:  # measure's real runs carry their length here (the CLI traces at most 16)
        raise expected(f"at most {MAX_RUN_STEPS:,} steps", steps, "--trace-steps")
    if run_steps is not None:
        _check_positive_int(run_steps, "--steps")
        if run_steps > MAX_RUN_STEPS:
            raise expected(f"at most {MAX_RUN_STEPS:,} steps (trainmem's limit; without --steps the run is "
                           "taken as a long one)", run_steps, "--steps")
    if seq_len is not None:
        _check_positive_int(seq_len, "--seq-len")


def _check_positive_int(value: Any, where: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise expected("a positive integer", value, where)


def batch_overflow(error: BaseException, batch_size: int, where: str) -> SetupError | None:
    """The error to report for a training step that failed because a tensor overflowed int64 sizes: the batch size
    is to blame where it is more than one sample; None for any other failure (and for a batch of 1, where the
    model's own sizes overflow). `where`: what overflowed, e.g. "module 0's forward"."""
    if batch_size <= 1 or not any(words in str(error) for words in OVERFLOW_WORDS):
        return None
    return SetupError(f"expected a batch size whose tensors stay within int64 sizes (at most {MAX_ELEMENTS:,} "
                      f"elements and bytes), got {batch_size:,}: {where} overflowed ({type(error).__name__}: "
                      f"{one_line(error, 120)})", where="--batch-size")


# --seq-lengths: a dataset's sequence lengths (or a sample of them) for pack_padded_sequence. A million lengths
# is a large corpus's worth; the trace sorts them once.
MAX_SEQUENCE_LENGTHS = 1_000_000


def sequence_lengths(value: Any) -> tuple[int, ...] | None:
    """--seq-lengths as text ("12,40,60") or a list of integers: each a positive integer, at most a million."""
    if value is None:
        return None
    items = value.split(",") if isinstance(value, str) else value
    if isinstance(items, (bytes, dict)) or not hasattr(items, "__iter__"):
        raise expected("sequence lengths such as 12,40,60", value, "--seq-lengths")
    items = list(items)
    if not items or len(items) > MAX_SEQUENCE_LENGTHS:
        raise expected(f"1 to {MAX_SEQUENCE_LENGTHS:,} sequence lengths such as 12,40,60", one_line(value)[:80],
                       "--seq-lengths")
    lengths = []
    for item in items:
        text = item.strip() if isinstance(item, str) else item
        number = int(text) if isinstance(text, str) and text.isdigit() else text
        if isinstance(number, bool) or not isinstance(number, int) or number < 1:
            raise expected("positive whole sequence lengths such as 12,40,60", item, "--seq-lengths")
        lengths.append(number)
    return tuple(lengths)


def positive_finite(value: Any) -> bool:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return False
    return number > 0 and math.isfinite(number)
