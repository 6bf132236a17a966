"""The one orchestrator: model reference + setup → prepare (source, target) → trace → assemble → Estimate.
It never asks what the device is; the target answers (targets/__init__.py)."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from typing import Any

from trainmem.devices import Device, DeviceRef, get_device
from trainmem.errors import SetupError
from trainmem.estimate.result import Estimate, LeanLoop
from trainmem.setup import Loop, TrainingSetup
from trainmem.setup.target_options import TargetOptions, refuse_loose_options


@dataclasses.dataclass(frozen=True)
class Prepared:
    """What an estimate needs besides the setup: the model's source, the target device and its target
    (options checked), and the module depth of the report. `prepare()` checks everything before tracing."""

    source: Any  # frontends.ModelSource
    device: Device
    depth: int
    options: dict[str, Any]  # the target's: cuda_context, alloc_conf, cuda_version, module_loading, cudnn_benchmark
    target: Any  # targets.Target, built from the device and the options


def setup_of(setup: TrainingSetup | None, setup_values: dict[str, Any], where: str) -> TrainingSetup:
    """The one reading of the Python API's setup, for estimate() and fit() alike: a TrainingSetup, setup
    values as keywords (the CLI flags' and TOML keys' names: batch_size=256, optimizer="adam",
    input_shape="1000"), or both, the keywords replacing the TrainingSetup's values. `where` names the
    caller in the error of a bad value."""
    if setup is not None and not isinstance(setup, TrainingSetup):
        raise SetupError(f"expected setup= as a trainmem.TrainingSetup (or the setup's values as keywords), "
                         f"got {type(setup).__name__}", where=where)
    if setup is None:
        return TrainingSetup.from_mapping(setup_values, where=where)
    if setup_values:
        return TrainingSetup.from_mapping({**_plain(setup), **setup_values}, where=where)
    return setup


def estimate(model: Any, *, setup: TrainingSetup | None = None, device: DeviceRef = "cpu", depth: int = 2,
             target_options: TargetOptions | Mapping[str, Any] | None = None, compare_loop: bool = False,
             framework: str = "auto", keras_backend: str | None = None, isolate: bool = False,
             cache: bool | None = None, **setup_values: Any) -> Estimate:
    """Estimate training memory for `model` (a reference string or an nn.Module).

    With `isolate`, the model's code runs in a supervised worker process, as the `trainmem` command runs it
    (estimate/isolated.py): what it does to its process (atexit, threads, forks, os._exit) stays there.

    Setup values may be passed as a TrainingSetup or as keywords (batch_size=256, optimizer="adam",
    input_shape="1000", …), the same names as the CLI flags and TOML keys (`setup_of`). `device` is a
    name ("cpu", "h100-80gb", "custom:capacity=24GiB,cc=8.9"), a torch.device or a trainmem.Device;
    "cuda" / torch.device("cuda") means this machine's GPU and is refused where none is visible
    (devices.py). `target_options` (a TargetOptions, or a dict of its keys) says how the target runs: its CUDA
    stack on a GPU `device` (setup/target_options.py), and TensorFlow's memory mode and oneDNN (below).
    With `compare_loop`, the setup is traced a second time in the lean loop, and the result says what
    deleting the loop's references early would save (`lean_loop`; not with --compile, where a second trace is a
    second Inductor compile). Both traces share one preparation: the model
    reference is resolved once, so a user's file runs once (the loop changes neither the model nor the
    target, as batch sizes do not in fit's ScaledBatches). `tf_onednn` (auto|on|off): a Keras model on TensorFlow
    on the CPU with oneDNN as TensorFlow decides for this CPU and environment, forced on or off; `tf_memory`:
    TensorFlow's GPU memory mode (targets/tf/gpu_memory.py). `cache`: True or False uses or skips the trace cache
    for this call (trace/cache_store.py: a run traced before is not traced again); None, the default, uses it
    unless it was switched off."""
    if isolate:  # the same call in a supervised worker process (estimate/isolated.py)
        return _isolated(model, dict(setup=setup, device=device, depth=depth, target_options=target_options,
                                     compare_loop=compare_loop, framework=framework, keras_backend=keras_backend,
                                     cache=cache, **setup_values))
    from trainmem.trace.cache_store import as_asked

    with as_asked(cache):
        return _estimated(model, setup, device, depth, target_options, compare_loop, framework, keras_backend,
                          setup_values)


def _estimated(model: Any, setup: TrainingSetup | None, device: DeviceRef, depth: int, target_options: Any,
               compare_loop: bool, framework: str, keras_backend: str | None, setup_values: dict[str, Any]) -> Estimate:
    refuse_loose_options(setup_values, "estimate()")
    setup = setup_of(setup, setup_values, "estimate()")
    run = TargetOptions.of(target_options, "estimate()")
    options = run.cuda()
    model = _framework_source(model, setup, framework, keras_backend)
    if framework_of(model) == "tensorflow":  # Keras on TensorFlow: its own trace and targets, the same assembler
        if setup.parallel.distributed:
            raise SetupError("expected a PyTorch model with --strategy (many ranks are traced with torch.distributed), "
                             f"got a Keras model {model.name!r}", where="--strategy")
        return _estimate_on_tensorflow(model, setup, device, depth, run)
    _refuse_tensorflow_options(run, model.name)
    chosen = prepare(model, setup, device, depth, **options)
    if setup.parallel.distributed and setup.compile:
        from trainmem.trace.compiled import check_traceable

        check_traceable(setup, cuda_target=False)
    if setup.parallel.distributed:  # many ranks: one trace per distinct rank role (estimate/per_rank.py)
        from trainmem.estimate.per_rank import estimate_distributed

        return estimate_distributed(chosen, setup)
    if compare_loop and setup.loop != Loop.LEAN and not setup.compile:  # --compile: a second trace is a second compile
        return _with_lean_comparison(chosen, setup)
    return assemble_traced(chosen, setup, trace(chosen, setup))


def _with_lean_comparison(chosen: Prepared, setup: TrainingSetup) -> Estimate:
    """The estimate and what the lean loop would need. The inline loop's trace is derived from the lean loop's (one
    trace: trace/loop_twin.py) where it can be; other loops are traced twice."""
    from trainmem.trace.loop_twin import derivable, inline_from_lean

    if derivable(setup):
        lean_traced = trace(chosen, dataclasses.replace(setup, loop=Loop.LEAN))
        derived = inline_from_lean(lean_traced)
        if derived is not None:
            est = assemble_traced(chosen, setup, derived)
            return _with_lean_loop(est, _allocated_of(chosen, lean_traced))
    est = assemble_traced(chosen, setup, trace(chosen, setup))
    return _with_lean_loop(est, lean_allocated(chosen, setup))


def cache_keyword(function: Callable[..., Any]) -> Callable[..., Any]:
    """`function` (fit) taking estimate()'s keyword `cache`: True or False uses or skips the trace cache for the
    call, None leaves it as switched (trace/cache_store.py as_asked)."""

    @functools.wraps(function)
    def call(*args: Any, cache: bool | None = None, **kwargs: Any) -> Any:
        from trainmem.trace.cache_store import as_asked

        with as_asked(cache):
            return function(*args, **kwargs)

    return call


def _isolated(model: Any, keywords: dict[str, Any]) -> Estimate:
    from trainmem.estimate.isolated import estimate_isolated

    return estimate_isolated(model, keywords)


def _refuse_tensorflow_options(run: TargetOptions, model_name: str) -> None:
    """TensorFlow's options, given for a PyTorch model: each refused in one line naming its flag."""
    for key, flag in (("dataset_size", "--dataset-size"), ("tf_onednn", "--tf-onednn"), ("tf_memory", "--tf-memory")):
        if getattr(run, key) is not None:
            raise SetupError(f"expected a Keras model on TensorFlow with {flag}, got a PyTorch model {model_name!r}",
                             where=flag)


def _estimate_on_tensorflow(source: Any, setup: TrainingSetup, device: DeviceRef, depth: int,
                            run: TargetOptions) -> Estimate:
    """A KerasSource (frontends/keras/reference.py) traced as model.fit runs its step on TensorFlow
    (trace/tf/keras_graph.py), on the TensorFlow target of the device (targets/tf/target.py)."""
    from trainmem.estimate.assemble import assemble
    from trainmem.targets import target_for
    from trainmem.trace.tf.keras_graph import trace_keras

    target_device = get_device(device)
    target = target_for(target_device, setup, "tensorflow", tf_memory=run.tf_memory, tf_onednn=run.tf_onednn,
                        dataset_size=run.dataset_size,
                        **run.cuda())
    traced = trace_keras(source.build, setup, name=source.name)
    traced = dataclasses.replace(traced, resolved={"framework": "keras", "keras_backend": "tensorflow",
                                                   "source": source.kind})
    return assemble(source, setup, target_device, target, traced, depth)


def _framework_source(model: Any, setup: TrainingSetup, framework: str, keras_backend: str | None) -> Any:
    """The model resolved once across frameworks: a torch ModelSource (prepare() takes it as it is) or a
    KerasSource (frontends/keras/reference.py)."""
    from trainmem.frontends.framework import resolve_model

    return resolve_model(model, setup, framework, keras_backend)


def framework_of(source: Any) -> str:
    from trainmem.frontends.framework import framework_of as of_source

    return of_source(source)


def prepare(model: Any, setup: TrainingSetup, device: DeviceRef = "cpu", depth: int = 2, **options: Any) -> Prepared:
    """Resolve the model and the target and check the target's options, without tracing."""
    from trainmem.frontends import ModelSource, resolve
    from trainmem.targets import target_for

    target_device = get_device(device)
    target = target_for(target_device, setup, **options)
    source = model if isinstance(model, ModelSource) else resolve(model, setup)  # resolved once by estimate()
    return Prepared(source, target_device, depth, options, target)


def trace(chosen: Prepared, setup: TrainingSetup):
    """Trace the training run of `setup` for the prepared target (trace.run.TraceResult)."""
    from trainmem.trace.run import trace_training

    return trace_training(chosen.source, setup, chosen.target.kernel_ops(), chosen.target.trace_semantics())


def assemble_traced(chosen: Prepared, setup: TrainingSetup, traced: Any) -> Estimate:
    """The device stream, the allocator's replay and the report facts of a traced run."""
    from trainmem.estimate.assemble import assemble

    return assemble(chosen.source, setup, chosen.device, chosen.target, traced, chosen.depth)


def lean_allocated(chosen: Prepared, setup: TrainingSetup) -> int:
    """The allocated figure of `setup` in the lean loop, as assemble() would give it (the target's stream through its
    allocator), without the process model that the comparison does not report: on a CPU that model replays glibc's
    heap over the whole run, most of an estimate's time (a 1.3B GPT: 9.8 s of 30 s)."""
    return _allocated_of(chosen, trace(chosen, dataclasses.replace(setup, loop=Loop.LEAN)))


def _allocated_of(chosen: Prepared, traced: Any) -> int:
    """A traced run's allocated figure, as assemble() would give it, without the process model."""
    stream = chosen.target.device_stream(traced.trace)
    replayed = chosen.target.allocator().replay(stream.events)
    return replayed.allocated if replayed.reserved is not None else replayed.tensor_peak


def _with_lean_loop(est: Estimate, lean_allocated_bytes: int) -> Estimate:
    """What the lean loop (`del outputs` before backward, `del loss, inputs` after it) would need."""
    return dataclasses.replace(est, lean_loop=LeanLoop(str(Loop.LEAN), lean_allocated_bytes,
                                                       est.allocated_bytes - lean_allocated_bytes))


def _plain(setup: TrainingSetup) -> dict[str, Any]:
    return {f.name: getattr(setup, f.name) for f in dataclasses.fields(setup)}
