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

from trainmem.estimate import Estimate, assemble_traced, prepare, trace
from trainmem.fit import Candidates, cuda_options, with_value
from trainmem.setup import TrainingSetup
from trainmem.trace.batch_scaling import SequenceScaling, StreamsDiffer, Unpredictable

POINTS = (32, 64, 128)  # the traced lengths the quadratic goes through
MULTIPLE = 32  # only lengths that are multiples of this are predicted (the module docstring says why)


class ScaledSequences(Candidates):
    """Sequence lengths predicted from the traces at POINTS, the answer confirmed by two real traces."""

    def __init__(self, model: Any, setup: TrainingSetup, device: Any, options: dict[str, Any], limit: int,
                 hf: bool) -> None:
        self.model, self.setup, self.device, self.options, self.limit, self.hf = model, setup, device, options, limit, hf
        self.prepared: dict[int, Any] = {}  # length -> its prepared run (an hf: model's batch follows its length)
        self.real: dict[int, Any] = {}  # length -> its real TraceResult
        self.assembled: dict[int, Estimate] = {}
        self.predicted: dict[int, Estimate] = {}
        self.scaling: SequenceScaling | None = None
        self.why_traced: str | None = None  # why predictions stopped (None: in use, or not needed yet)
        self.confirmed: list[int] = []

    def _setup_at(self, length: int) -> TrainingSetup:
        return with_value(self.setup, length, True, self.hf)

    def _prepared(self, length: int) -> Any:
        if length not in self.prepared:
            self.prepared[length] = prepare(self.model, self._setup_at(length), self.device,
                                            self.options.get("depth", 2), **cuda_options(self.options))
        return self.prepared[length]

    def _real(self, length: int) -> Any:
        if length not in self.real:
            self.real[length] = trace(self._prepared(length), self._setup_at(length))
        return self.real[length]

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

    def estimate(self, length: int) -> Estimate:
        scaling = self._scaling() if length > POINTS[-1] and length % MULTIPLE == 0 else None
        if length not in self.real and scaling is not None:
            try:
                predicted = scaling.at(length)
            except Unpredictable:
                predicted = None
            if predicted is not None:
                self.predicted[length] = assemble_traced(self._prepared(length), self._setup_at(length), predicted)
                return self.predicted[length]
        if length not in self.assembled:
            self.assembled[length] = assemble_traced(self._prepared(length), self._setup_at(length), self._real(length))
        return self.assembled[length]

    def confirm(self, best: int | None, first_miss: int | None) -> bool:
        """Trace the longest that fits and the first that does not, where they were predicted, and compare."""
        for point in (value for value in (best, first_miss) if value in self.predicted):
            try:
                real = self._real(point)
            except Exception:  # noqa: BLE001 - the search runs again on real traces, where this failure is listed
                real = None
            if real is None or not self.scaling.matches(point, real):
                self.why_traced = (f"the real trace at length {point} "
                                   f"{'failed' if real is None else 'differs from its prediction'}")
                self.scaling, self.predicted = None, {}
                return False
            self.assembled[point] = self.predicted.pop(point)  # the same trace, replayed alike
            self.confirmed.append(point)
        return True

    def summary(self) -> dict[str, Any]:
        if self.scaling is not None:
            how = (f"predicted from the traces at sequence lengths {', '.join(map(str, POINTS))}"
                   + (f", confirmed by real traces at {' and '.join(map(str, self.confirmed))}" if self.confirmed else ""))
        else:
            how = (f"traced, each one: {self.why_traced}" if self.why_traced else
                   f"traced, each one (lengths {', '.join(map(str, sorted(self.real)))}): nothing left to predict")
        return {"traced": sorted(self.real), "predicted": sorted(self.predicted), "how": how}
