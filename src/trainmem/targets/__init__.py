"""Targets: a device behind one interface (`Target`), and the values a target produces. No torch.

A target turns a Trace (what the dispatcher saw) into the device's event stream (`DeviceStream`): the
same storages, plus buffers that kernels allocate below the dispatcher (scratch, layout reorders,
workspaces), plus size corrections where the fake kernel's output differs from the real one (oneDNN's
LSTM workspace); it names its allocator model (alloc/replay.py) and says what the process holds
besides the allocator (`ProcessMemory`).

- cpu_target.CpuTarget: kernel rules in cpu_kernels.py (oneDNN in onednn/), the runtime floor in cpu_runtime.py;
- cuda_target.CudaTarget: the stream in cuda_stream.py (cuDNN workspaces in cudnn.py), the CUDA context and
  library images in cuda_runtime.py, every CUDA rule with its source and test in cuda_rules.py;
- tf/target.py TfCpuTarget and TfGpuTarget: Keras's fit step on TensorFlow (tf/cpu_process.py, tf/gpu_memory.py),
  reporting Keras's layers in tf/keras_section.py.
`target_for(device, setup, framework, **options)` picks one; nothing else asks what the device is.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Protocol

from trainmem.alloc.device_events import DeviceEvent
from trainmem.trace.events import Trace

if TYPE_CHECKING:  # the seam's types, named for readers and type checkers; none is imported at run time
    from trainmem.alloc.replay import Allocator, ReplayResult
    from trainmem.devices import Device
    from trainmem.frontends import ModelSource
    from trainmem.setup import TrainingSetup
    from trainmem.setup.layout import ParallelLayout
    from trainmem.trace.run import TraceSemantics
    from trainmem.trace.traced import TraceResult


@dataclasses.dataclass(frozen=True)
class KernelEffect:
    """What one kernel call does below the dispatcher: transient buffers before and after its outputs
    are allocated (signed bytes, + alloc / - free, in order) and true sizes of some outputs."""

    before: tuple[int, ...] = ()
    after: tuple[int, ...] = ()
    output_nbytes: tuple[tuple[int, int], ...] = ()  # (output index, real nbytes)
    rule: str = ""


@dataclasses.dataclass(frozen=True)
class DeviceStream:
    """What a target derives from a trace: the event stream its allocator sees, and what it did."""

    events: list[DeviceEvent]  # the point estimate's stream
    rules: dict[str, int]  # kernel rule → times applied
    gaps: tuple[str, ...] = ()  # what the target knows it does not size
    events_high: list[DeviceEvent] | None = None  # the high estimate's stream, where uncertain buffers differ
    managed_peak: int = 0  # peak bytes of storages outside the allocator (CUDA managed memory)
    libraries: dict[str, bool] = dataclasses.field(default_factory=dict)  # library → loaded by this run


@dataclasses.dataclass(frozen=True)
class ProcessMemory:
    """What the process holds at the peak beyond the allocator's stream, by the target's runtime."""

    parts: dict[str, int]  # process_parts: name → bytes; process_bytes is their sum
    high: int | None  # process_bytes_high (None: no spread modelled)
    leading_warnings: list[str]  # said before the trace's own warnings (a run that fails says so first)
    warnings: list[str]  # the runtime's assumptions, after the trace's warnings
    coverage: dict[str, Any]  # what the target adds to `coverage` after ops and kernel_rules
    framework: FrameworkFigures | None = None  # a target of another framework: the rows it reports in its own terms


@dataclasses.dataclass(frozen=True)
class FrameworkFigures:
    """What a target of a framework other than PyTorch (targets/tf/target.py) reports in its own terms, where the
    assembler would otherwise derive it from a PyTorch trace: the tensor peak its own stream reaches (kernel
    temporaries included), the per-module rows (Keras's layers), the hand arithmetic, the coverage, and the
    Estimate's framework section (its JSON keys and text report). No rules of thumb are set beside it."""

    tensor_bytes: int
    modules: tuple  # estimate.result.ModuleRow
    explanation: Any  # explain.Explanation
    coverage: dict[str, Any]
    section: Any  # estimate.result.FrameworkSection


@dataclasses.dataclass(frozen=True)
class ReportWords:
    """What the reports call a target's figures, so that no renderer asks what the device is (report/text.py,
    report/html.py, report/keras_text.py read these). Each target class holds its own (`report_words`)."""

    process_counter: str  # the tool whose number the process figure is: nvidia-smi, peak RSS
    tensors_note: str  # beside the live tensors' row of the text report
    allocated_note: str  # beside the allocated row
    reserved_note: str  # beside the reserved row
    allocated_label: str  # the drawing's name of the allocated line
    breakdown_total: str  # the Estimate field the breakdown adds up to
    allocator_holds: str  # the Estimate field of what the allocator holds (the rest of the process is outside it)
    device_suffix: str  # after the device's name in the one-line answer (" RAM" on the CPU)
    ranks_show_reserved: bool  # the per-rank table has a reserved column
    sweep_columns: tuple[tuple[str, str], ...]  # a sweep table's peak columns: (heading, Estimate field)
    keras_floor_contrast: str  # `compare` with Keras: why the process floors of PyTorch and TensorFlow differ here


class Target(Protocol):
    """A device behind one interface (DESIGN.md "Seams"): the orchestrator asks it, never "is this CUDA?".

    The words and roundings a report needs from the target are attributes: `allocated_name` (what
    the allocated peak is called), `runtime_words` (what `runtime` in the breakdown holds),
    `module_rounding` (bytes a live block counts for in the per-module table) and
    `checkpoint_lists_blocks` (whether the checkpointing warning names the wrapped blocks)."""

    allocated_name: str
    runtime_words: str
    checkpoint_lists_blocks: bool
    report_words: ReportWords  # what the reports call its figures (a class attribute: no target is built for it)
    # fit's default margin on this target: the worst low error measured for its process counter, rounded up
    # (fraction of the capacity, the results file and row it comes from); tests/test_fit.py checks both
    fit_margin: tuple[float, str]

    def module_rounding(self, nbytes: int) -> int: ...

    def kernel_ops(self) -> frozenset[str]:
        """Ops whose calls the trace records for this target's kernel rules."""
        ...

    def trace_semantics(self) -> TraceSemantics | None:
        """What the target switches into the trace (trace.run.TraceSemantics), or None."""
        ...

    def device_stream(self, trace: Trace) -> DeviceStream: ...

    def allocator(self) -> Allocator:
        """Its allocator model (alloc.replay.Allocator)."""
        ...

    def allocator_settings(self) -> str | None:
        """A caching allocator's settings as the report states them; None for an allocator without any."""
        ...

    def process_memory(self, source: ModelSource, setup: TrainingSetup, traced: TraceResult, stream: DeviceStream,
                       replayed: ReplayResult) -> ProcessMemory:
        """What the process holds besides the allocator's figures, and the assumptions behind it."""
        ...

    def rank_process_parts(self, layout: ParallelLayout, role: Any) -> list[tuple[str, int, str]]:
        """What one rank of a distributed run holds beside a single process's figures, as (process part, bytes,
        assumption): the collectives' runtime of this device (NCCL's communicators, gloo's process group)."""
        ...


def _target_class(device: Device, framework: str = "torch") -> Any:
    """The one place that maps a device kind (and the framework that runs on it) to its target."""
    if framework == "tensorflow":
        from trainmem.targets.tf.target import TfCpuTarget, TfGpuTarget

        return TfGpuTarget if device.kind == "cuda" else TfCpuTarget
    if device.kind == "cuda":
        from trainmem.targets.cuda_target import CudaTarget

        return CudaTarget
    from trainmem.targets.cpu_target import CpuTarget

    return CpuTarget


def target_for(device: Device, setup: TrainingSetup, framework: str = "torch", **options: Any) -> Target:
    """The target for a device (devices.Device) running `framework` ("torch", or "tensorflow" for Keras on
    TensorFlow), its options checked. Options (cuda_context, alloc_conf, cuda_version, module_loading,
    cudnn_benchmark) are PyTorch's CUDA target's, tf_memory and tf_onednn TensorFlow's; each target refuses the
    others' in one line."""
    return _target_class(device, framework).create(device, setup, **options)


def report_words(device: Device, framework: str = "torch") -> ReportWords:
    """What the reports call the figures of the device's target."""
    return _target_class(device, framework).report_words


def words_for(estimate: Any) -> ReportWords:
    """What the reports call an estimate's figures: its framework section's target's words where it has one (Keras
    on TensorFlow: targets/tf/target.py), else the device's target's."""
    section = getattr(estimate, "framework", None)
    return section.report_words if section is not None else report_words(estimate.device)


def fit_margin(device: Device) -> tuple[float, str]:
    """The fraction of the device's capacity fit keeps free by default, and where it comes from."""
    return _target_class(device).fit_margin
