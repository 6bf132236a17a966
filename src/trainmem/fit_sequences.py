"""`trainmem fit --max-seq`'s candidates from three real traces (fit.py's search, trace/batch_scaling.py).

A training step at sequence lengths s₁ < s₂ < s₃ makes the same ops in the same order; what changes is the size of
whatever holds the sequence: a multiple of the length (activations, embeddings, gradients of activations) or of its
square (attention's scores and their softmax where they are materialized). So every size is a quadratic in the
length, fixed by three traces (SequenceScaling); another length gets its predicted trace, which the allocator
replays as a real one. But not every size follows the length itself: a CUDA run's memory-efficient attention keeps
its logsumexp for [B, H, ceil(L/32)·32] and pads an attention bias to a multiple of 16 (trace/cuda_composites.py),
so a quadratic through lengths 2, 4 and 8 is wrong at 1,024 (measured on hf:gpt2 for an A100: 12,288 B predicted
for the logsumexp, 393,216 B traced). At multiples of 32 every such padding is the length itself: the three traced
lengths are 32, 64 and 128 (the search's doubling traces them anyway), only multiples of 32 are predicted, and any
other length is traced for real (the shorter ones, and the last steps of the bisection).

Three points fit any quadratic, and a size that is not one (a backend chosen by the length) would make a prediction
wrong between them. So the answer is not trusted until the two lengths it rests on are traced for real and equal
their predictions: the longest that fits and the first that does not. Equal, the answer stands (the search's verdicts
at those two lengths are real traces'); different, or traces that are not one stream, and every candidate is
traced, as before.
"""

from __future__ import annotations

from typing import Any

from trainmem.estimate import prepare
from trainmem.fit import with_value
from trainmem.fit_predicted import PredictedCandidates, cuda_options
from trainmem.setup import TrainingSetup
from trainmem.trace.batch_scaling import SequenceScaling, StreamsDiffer

POINTS = (32, 64, 128)  # the traced lengths the quadratic goes through
MULTIPLE = 32  # only lengths that are multiples of this are predicted (the module docstring says why)


class ScaledSequences(PredictedCandidates):
    """Sequence lengths predicted from the traces at POINTS, the answer confirmed by two real traces."""

    unit = "length"

    def __init__(self, model: Any, setup: TrainingSetup, device: Any, options: dict[str, Any], limit: int,
                 hf: bool) -> None:
        super().__init__()
        self.model, self.setup, self.device, self.options, self.limit, self.hf = model, setup, device, options, limit, hf
        self.prepared: dict[int, Any] = {}  # length -> its prepared run (an hf: model's batch follows its length)

    def _setup_at(self, length: int) -> TrainingSetup:
        return with_value(self.setup, length, True, self.hf)

    def _prepared(self, length: int) -> Any:
        if length not in self.prepared:
            self.prepared[length] = prepare(self.model, self._setup_at(length), self.device,
                                            self.options.get("depth", 2), **cuda_options(self.options))
        return self.prepared[length]

    def _predictable(self, length: int) -> bool:
        return length > POINTS[-1] and length % MULTIPLE == 0

    def _scaling(self) -> SequenceScaling | None:
        if self.scaling is None and self.why_traced is None:
            if POINTS[-1] > self.limit:
                self.why_traced = f"the limit {self.limit} leaves no three lengths {POINTS} to match"
                return None
            try:
                self.scaling = SequenceScaling([(length, self._real(length)) for length in POINTS])
            except StreamsDiffer as differ:
                self.why_traced = f"the traces at lengths {', '.join(map(str, POINTS))} differ ({differ})"
        return self.scaling

    def _to_confirm(self, best: int | None, first_miss: int | None) -> list[int]:
        """The longest that fits and the first that does not, where they were predicted."""
        return [value for value in (best, first_miss) if value in self.predicted]

    def _how(self) -> str:
        return (f"predicted from the traces at sequence lengths {', '.join(map(str, POINTS))}"
                + (f", confirmed by real traces at {' and '.join(map(str, self.confirmed))}" if self.confirmed else ""))
