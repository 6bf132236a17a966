"""The answer, as frozen values: `Estimate` and its typed rows. `to_dict()` gives the JSON of DESIGN.md
(the keys scripts rely on), `str()` the terminal report. No torch."""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol

from trainmem.baselines import Baseline
from trainmem.devices import Device
from trainmem.explain import Explanation
from trainmem.setup import TrainingSetup


# The name the report gives the model itself, in the text and the JSON alike: the per-module rows
# (estimate/assemble.py) and the peak's module (`module_label`). PyTorch's own qualified name for it is ""
# (named_modules(), get_submodule("")), which reads as nothing in a report.
ROOT_MODULE_LABEL = "(model)"


def module_label(qualified_name: str) -> str:
    """A module's name in the report: its qualified name, ROOT_MODULE_LABEL for the model itself."""
    return qualified_name or ROOT_MODULE_LABEL


def step_label(step: int, steps: int) -> str:
    """Where the peak's step sits among the traced steps, with the number JSON's peak.step holds (counted
    from 0): "step 1 (of steps 0–1 traced)"."""
    if steps <= 1:
        return f"step {step} (the one step traced, counted from 0)"
    return f"step {step} (of steps 0–{steps - 1} traced)"


@dataclasses.dataclass(frozen=True)
class ModuleRow:
    """One module (to the report's depth): its parameters, the activations it saved for backward in
    the last step, and the bytes it owns at the peak."""

    module: str  # module_label(): ROOT_MODULE_LABEL for the root
    parameters: int
    activation_bytes: int
    bytes_at_peak: int


@dataclasses.dataclass(frozen=True)
class AllocatorSummary:
    """A caching allocator's state at its peaks: what it reserved beyond what it allocated, and its
    segments at the allocated peak as torch.cuda.memory_snapshot() would list them."""

    fragmentation_at_allocated_peak: int
    fragmentation_at_reserved_peak: int
    segments_at_peak: int
    large_segment_bytes_at_peak: int
    small_segment_bytes_at_peak: int
    settings: str
    out_of_memory: str | None


@dataclasses.dataclass(frozen=True)
class LeanLoop:
    """The same setup in the lean loop (`del outputs` before backward, `del loss, inputs` after it): its allocated
    figure only (estimate/orchestrate.py lean_allocated: no process model, which on a CPU is the glibc replay)."""

    loop: str
    allocated_bytes: int
    saving_bytes: int  # this estimate's allocated bytes minus the lean loop's


@dataclasses.dataclass(frozen=True)
class RankEstimate:
    """One distinct rank role of a many-rank run: the ranks it stands for and what each of them holds."""

    label: str  # "all ranks", "pp stage 1", "dp indices 0-6" …
    ranks: tuple[int, ...]
    peak: dict[str, Any]  # tensor_bytes, allocated_bytes, reserved_bytes, process_bytes, phase, module, op, step
    breakdown: dict[str, int]
    process: dict[str, int]  # process_parts
    host_bytes: int = 0  # offloaded tensors in host RAM at their peak (not in the device figures)

    @property
    def process_bytes(self) -> int:
        return int(self.peak["process_bytes"])

    def to_dict(self) -> dict[str, Any]:
        return {"label": self.label, "ranks": list(self.ranks), "peak": dict(self.peak),
                "breakdown": dict(self.breakdown), "process": dict(self.process), "host_bytes": self.host_bytes}


@dataclasses.dataclass(frozen=True)
class ReplayInput:
    """What the allocator replayed, kept so that the timeline, the plot, the HTML report and the memory_viz
    snapshot (report/) can replay it again, point by point. Never part of to_dict()."""

    events: tuple  # the target's DeviceEvent stream, exactly as the allocator replayed it
    allocator: Any  # the alloc.replay Allocator (CpuTensorAllocator | CudaAllocator)
    capacity_bytes: int  # the device's capacity


class FrameworkSection(Protocol):
    """The typed section of an Estimate that only one framework has (targets/tf/keras_section.py KerasSection)."""

    def to_json(self) -> dict[str, Any]:
        """The keys it adds to the estimate's JSON."""
        ...

    def render(self, est: Estimate) -> str:
        """The estimate's terminal report, in the framework's own terms."""
        ...

    def quiet_note(self) -> str:
        """What --quiet adds after its one-line answer ("" for nothing)."""
        ...


@dataclasses.dataclass(frozen=True)
class Estimate:
    """The answer: peaks, what is alive at the peak, where it happens, and why.
    Prints itself as the terminal report; `to_dict()` gives the JSON of DESIGN.md."""

    model_name: str
    setup: TrainingSetup
    device: Device
    parameters: int  # the model's own, as its card counts them (LoRA's adapters apart)
    trainable_parameters: int
    tensor_bytes: int
    process_bytes: int
    breakdown: dict[str, int]
    peak_phase: str
    peak_module: str  # the qualified name ("" for the model itself); reports show module_label() of it
    peak_op: str
    peak_step: int  # counted from 0, as JSON's peak.step; the text says so (step_label)
    modules: tuple[ModuleRow, ...]
    warnings: tuple[str, ...]
    explanation: Explanation
    process_parts: dict[str, int]
    coverage: dict[str, Any]
    # each figure is one field, named as the JSON's peak names it. allocated_bytes: CUDA's max_memory_allocated;
    # given as None (the CPU, whose allocator rounds nothing away), it is the tensor peak
    allocated_bytes: int | None = None
    reserved_bytes: int | None = None  # CUDA: max_memory_reserved (None: the CPU allocator caches nothing)
    allocator: AllocatorSummary | None = None  # a caching allocator's fragmentation and segments
    fits_override: bool | None = None  # False when the simulated allocator ran out of memory
    baselines: tuple[Baseline, ...] = ()  # rules of thumb beside us
    # the upper end of what real runs of this setup show (run-to-run spread, uncertain runtime facts), never
    # below process_bytes; given as None (no spread modelled), it is process_bytes
    process_bytes_high: int | None = None
    quantized_parameters: int = 0  # parameters stored in 4 bits (QLoRA), included in `parameters`
    adapter_parameters: int = 0  # parameters LoRA adds to the model, not included in `parameters`
    quantized_storage_bytes: int = 0  # their packed storage with its quantization statistics
    resolved: dict[str, Any] = dataclasses.field(default_factory=dict)  # setup values the trace used
    lean_loop: LeanLoop | None = None  # with compare_loop: the lean loop's figures (None: not compared)
    # many ranks (estimate/per_rank.py): one row per distinct rank role; this Estimate is the most loaded's
    ranks: tuple[RankEstimate, ...] = ()
    parallel: dict[str, Any] | None = None  # layout, most_loaded, spread_bytes, host RAM, notes, cross_checks
    # the stream and allocator behind the figures; many ranks: the most loaded's
    replay_input: ReplayInput | None = dataclasses.field(default=None, repr=False, compare=False)
    # what only a framework other than PyTorch reports, with its own JSON keys and text report (Keras on
    # TensorFlow: targets/tf/keras_section.py KerasSection); None for PyTorch
    framework: FrameworkSection | None = None
    # what the trace cache did (trace/cache_store.py CacheUse: reused, stored, off, not cached): not part of the
    # answer, which is the same bytes however it was reached (the command says a reuse on stderr)
    trace_cache: Any = dataclasses.field(default=None, compare=False)
    load: dict[str, Any] | None = None  # --load: the load's and training's peaks (estimate/load_report.py)

    def __post_init__(self) -> None:
        # frozen: the two defaults are settled once, here (dataclasses.replace passes the settled values on,
        # and settles a high end given below a new process_bytes again)
        object.__setattr__(self, "process_bytes_high", max(self.process_bytes, self.process_bytes_high or 0))
        if self.allocated_bytes is None:
            object.__setattr__(self, "allocated_bytes", self.tensor_bytes)

    @property
    def fits(self) -> bool:
        return self.process_bytes <= self.device.capacity_bytes and self.fits_override is not False

    def to_dict(self) -> dict[str, Any]:
        from trainmem import __version__

        return {
            "trainmem_version": __version__,
            "model": {"name": self.model_name, "parameters": self.parameters,
                      "trainable_parameters": self.trainable_parameters,
                      "adapter_parameters": self.adapter_parameters,
                      "quantized_parameters": self.quantized_parameters,
                      "quantized_storage_bytes": self.quantized_storage_bytes},
            "setup": {**self.setup.to_dict(), "resolved": self.resolved},
            **({"lean_loop": dataclasses.asdict(self.lean_loop)} if self.lean_loop else {}),
            **({"load": self.load} if self.load else {}),
            "device": self.device.to_dict(),
            "peak": {"tensor_bytes": self.tensor_bytes, "allocated_bytes": self.allocated_bytes,
                     "reserved_bytes": self.reserved_bytes, "process_bytes": self.process_bytes,
                     "process_bytes_high": self.process_bytes_high,
                     "phase": self.peak_phase, "module": module_label(self.peak_module), "op": self.peak_op,
                     "step": self.peak_step},
            "breakdown": dict(self.breakdown),
            "process": dict(self.process_parts),
            "fits": self.fits,
            "modules": [dataclasses.asdict(row) for row in self.modules],
            "explanation": self.explanation.to_dict(),
            "coverage": self.coverage,
            "baselines": [dataclasses.asdict(row) for row in self.baselines],
            **({"allocator": dataclasses.asdict(self.allocator)} if self.allocator else {}),
            **({"ranks": [row.to_dict() for row in self.ranks], "parallel": self.parallel}
               if self.parallel is not None else {}),
            "warnings": list(self.warnings),
            **(self.framework.to_json() if self.framework is not None else {}),
        }

    def __str__(self) -> str:
        from trainmem.report.text import render_text

        return render_text(self)

    def timeline(self, max_points: int = 4000) -> Any:
        """Memory over the step, point by point (report/timeline.py): what the plot and the HTML report draw."""
        from trainmem.report.timeline import timeline

        return timeline(self, max_points)

    def write_plot(self, path: str) -> None:
        """The timeline as a PNG or SVG, as `--plot` draws it (needs matplotlib)."""
        from trainmem.report.plot import write_timeline_plot

        write_timeline_plot(self, path)

    def write_html(self, path: str) -> None:
        """The self-contained HTML report, as `--html` writes it."""
        from trainmem.report.html import write_html

        write_html(self, path)

    def write_memory_snapshot(self, path: str, max_entries: int | None = None) -> str:
        """The simulated allocator's history for PyTorch's memory_viz, as `--memory-snapshot` writes it; returns
        what was cut ("" when nothing)."""
        from trainmem.report.memviz import write_snapshot
        from trainmem.report.memviz_limits import DEFAULT_MAX_ENTRIES

        return write_snapshot(self, path, max_entries or DEFAULT_MAX_ENTRIES)

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        """IPython's pretty printer: the text report, not the dataclass's fields."""
        printer.text(str(self))

    def _repr_html_(self) -> str:
        """Jupyter: the summary and the timeline as inline SVG (report/html.py)."""
        from trainmem.report.html import notebook_html

        return notebook_html(self)
