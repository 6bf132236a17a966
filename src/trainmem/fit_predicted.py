"""Where fit's search takes its candidates' estimates from (fit.py search): the base, the searches that predict most
candidates' traces from a few real ones and confirm the answer with real traces, and the batch search from two
(trace/batch_scaling.py says why a trace is affine in the batch; fit_sequences.py has the sequence search)."""

from __future__ import annotations

import dataclasses
from typing import Any

from trainmem.devices import DeviceRef
from trainmem.estimate import Estimate, assemble_traced, prepare, trace
from trainmem.setup import TrainingSetup
from trainmem.setup.target_options import TargetOptions
from trainmem.trace.batch_scaling import BatchScaling, StreamsDiffer, Unpredictable


class Candidates:
    """Where the search's estimates come from."""

    def estimate(self, value: int) -> Estimate:
        raise NotImplementedError

    def confirm(self, best: int | None, first_miss: int | None) -> bool:
        """False when an estimate the answer rests on proved wrong: the search must run again."""
        return True

    def summary(self) -> dict[str, Any]:
        raise NotImplementedError


def cuda_options(options: dict[str, Any]) -> dict[str, Any]:
    """The CUDA target's options among fit's (the others: the report depth)."""
    return {key: value for key, value in options.items() if key in TargetOptions.CUDA_KEYS}


class PredictedCandidates(Candidates):
    """Candidates whose traces are predicted from a few real ones (ScaledBatches below; fit_sequences.py's
    ScaledSequences): a prediction where `_predictable` says so and the traces matched, else a real trace; `confirm`
    traces the points `_to_confirm` picks for real and compares each with its prediction. A subclass gives
    `_setup_at`, `_prepared`, `_scaling`, `_predictable`, `_to_confirm` and `_how` (the words of a search that
    predicted); `unit` names its values."""

    unit = "batch"

    def __init__(self) -> None:
        self.real: dict[int, Any] = {}  # value -> its real TraceResult
        self.assembled: dict[int, Estimate] = {}  # value -> the estimate of its real trace
        self.predicted: dict[int, Estimate] = {}  # value -> the estimate of its predicted trace
        self.scaling: Any = None  # trace/batch_scaling.py BatchScaling or SequenceScaling, once matched
        self.why_traced: str | None = None  # why predictions stopped (None: they are in use)
        self.confirmed: list[int] = []

    def _real(self, value: int) -> Any:
        if value not in self.real:
            self.real[value] = trace(self._prepared(value), self._setup_at(value))
        return self.real[value]

    def estimate(self, value: int) -> Estimate:
        scaling = self._scaling() if self._predictable(value) else None
        if value not in self.real and scaling is not None:
            try:
                predicted = scaling.at(value)
            except Unpredictable:
                predicted = None
            if predicted is not None:
                self.predicted[value] = assemble_traced(self._prepared(value), self._setup_at(value), predicted)
                return self.predicted[value]
        if value not in self.assembled:
            self.assembled[value] = assemble_traced(self._prepared(value), self._setup_at(value), self._real(value))
        return self.assembled[value]

    def confirm(self, best: int | None, first_miss: int | None) -> bool:
        for point in self._to_confirm(best, first_miss):
            try:
                real = self._real(point)
            except Exception:  # noqa: BLE001 - the search runs again on real traces, where this failure is listed
                real = None
            if real is None or not self.scaling.matches(point, real):
                self.why_traced = (f"the real trace at {self.unit} {point} "
                                   f"{'failed' if real is None else 'differs from its prediction'}")
                self.scaling, self.predicted = None, {}
                return False
            self.assembled[point] = self.predicted.pop(point)  # the prediction's estimate: the same trace, replayed
            self.confirmed.append(point)
        return True

    def summary(self) -> dict[str, Any]:
        if self.scaling is not None:
            how = self._how()
        else:
            how = (f"traced, each one: {self.why_traced}" if self.why_traced else
                   f"traced, each one ({self.unit} {', '.join(map(str, sorted(self.real)))}): nothing left to predict")
        return {"traced": sorted(self.real), "predicted": sorted(self.predicted), "how": how}


class ScaledBatches(PredictedCandidates):
    """Batch sizes from two real traces: trace the training step at two batch sizes, match the two traces
    value by value (trace/batch_scaling.py), and give any other batch its predicted trace, which the
    allocator replays as it would a real one. The pair is (1, 2), both candidates the search tries first
    (a contiguity flag batch 1 sets alone is batch 2's for the rest: BatchScaling); when batch 1 traces
    another stream (an op skipped because a size-1 dimension needs no copy, an RNN kernel's other path),
    (2, 4). Batch 1 always keeps its own real trace.

    Two traces fit any line: `confirm` traces the answer for real and compares it with its prediction,
    value for value. Equal, the answer stands (three traces on one line, and the answer's estimate is
    a real trace's); different, or streams that do not match at all, and every candidate is traced."""

    def __init__(self, model: Any, setup: TrainingSetup, device: DeviceRef, options: dict[str, Any],
                 limit: int, hf: bool = False) -> None:  # hf: as ScaledSequences takes it (a batch's search ignores it)
        super().__init__()
        self.setup, self.limit = setup, limit
        self.prepared = prepare(model, setup, device, options.get("depth", 2), **cuda_options(options))

    def _setup_at(self, batch: int) -> TrainingSetup:
        return dataclasses.replace(self.setup, batch_size=batch)

    def _prepared(self, batch: int) -> Any:
        return self.prepared

    def _predictable(self, batch: int) -> bool:
        # 1 and 2 are traced whatever the pair; the pair is matched when a batch above them is asked for,
        # so that (2, 4) traces 4 only when the search reaches it
        return batch > 2

    def _scaling(self) -> BatchScaling | None:
        if self.scaling is None and self.why_traced is None:
            pairs = [(first, second) for first, second in ((1, 2), (2, 4)) if second <= self.limit]
            why = [f"the limit {self.limit} leaves no two batch sizes to match"]
            for first, second in pairs:
                try:
                    self.scaling = BatchScaling(first, self._real(first), second, self._real(second))
                    break
                except StreamsDiffer as differ:
                    why.append(f"traces at batch {first} and {second} differ ({differ})")
            if self.scaling is None:
                self.why_traced = "; ".join(why[1:] or why)
        return self.scaling

    def _to_confirm(self, best: int | None, first_miss: int | None) -> list[int]:
        """The answer's batch (the first miss when the best was traced already)."""
        return [value for value in (best, first_miss) if value in self.predicted][:1]

    def _how(self) -> str:
        return (f"predicted from the traces at batch {self.scaling.first_batch} and {self.scaling.second_batch}"
                + (f", confirmed by a real trace at batch {self.confirmed[0]}" if self.confirmed else ""))
