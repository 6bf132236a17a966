"""Configurations side by side: models × swept setup values, each estimated, with the largest batch that fits
each named device. `trainmem compare A B … [--sweep batch=1,2,4 precision=fp32,bf16-mixed] [--devices …]`
and `trainmem.sweep(...)` / `trainmem.compare_setups(...)`.

Each configuration is one `estimate()` of its setup on its device; the figures are exactly those estimate()
gives (the model reference is resolved once per distinct setup, as estimate() resolves it once for its two
loops). The largest batch per device is `trainmem fit`'s search (fit.search) on fit's candidates
(fit.ScaledBatches: traces at batch 1 and 2, the rest predicted, the answer traced to confirm), with one
saving: a trace depends on the model, the setup and what the target switches into the trace (its kernel ops
and its trace semantics: CUDA's compute capability), not on the device's capacity, so devices that trace
alike share their traces (a100-40gb and a100-80gb, or every batch size of one configuration), and only the
allocator replay runs per device. Configurations that differ only in the batch size or the device share the
whole search.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import time
from collections.abc import Mapping, Sequence
from typing import Any
from collections.abc import Callable

from trainmem.errors import NothingEvaluated, SetupError, TrainmemError, failure_reason, quote, unknown_key
from trainmem.setup import SETUP_KEYS, TrainingSetup
from trainmem.setup.target_options import TargetOptions, refuse_loose_options
from trainmem.sweep_result import DeviceBudget, LargestBatch, SweepResult, SweepRow

# The most configurations one command estimates. Each is a whole trace and replay: `time trainmem estimate
# hf:gpt2 --seq-len 128` took 11.2 s of CPU (user; 30.8 s wall on a shared 2-core machine, 2026-12-04), two
# traces with the lean-loop comparison estimate adds, so about 6 s a configuration of GPT-2's size. 64 is then
# some 6 to 16 minutes, and a table of 64 rows still reads on one screen; a larger grid is more than one
# comparison (and a slip such as batch=1,…,1000 would run for hours). --time-limit bounds the time as well.
MAX_CONFIGURATIONS = 64
# fit's own search limit (fit.fit's `limit`): the largest batch searched
FIT_LIMIT = 1 << 24
ALIASES = {"batch": "batch_size"}
# The other run options a sweep may change: the device, and the CUDA run's (TargetOptions.CUDA_KEYS).
RUN_KEYS = frozenset({"device", *TargetOptions.CUDA_KEYS})
SWEEP_KEYS = frozenset(SETUP_KEYS | RUN_KEYS) - {"inputs", "parallel", "steps"}
# Keys whose one value holds commas or is a list (a shape, name patterns, LoRA's k=v list): the comma-separated
# text form cannot list several; trainmem.sweep() takes them as Python lists.
TEXT_REFUSED = frozenset({"input_shape", "input_dtype", "input_max", "target_shape", "freeze", "lora"})


@dataclasses.dataclass(frozen=True)
class Axis:
    key: str  # the setup or run key (batch_size, precision, device …)
    shown: str  # the name as the user typed it (batch)
    values: tuple[Any, ...]  # converted values, as estimate() takes them
    texts: tuple[str, ...]  # as typed, for the table and for errors


@dataclasses.dataclass(frozen=True)
class Configuration:
    model: Any  # a model reference (or an nn.Module)
    label: tuple[tuple[str, str], ...]  # (column, value) pairs that tell it from the others
    setup: TrainingSetup
    device: str
    options: TargetOptions  # how the target runs: the CUDA run's options, tf_memory


def canonical_key(typed: str) -> str:
    key = typed.strip().lower().replace("-", "_")
    return ALIASES.get(key, key)


def parse_sweep(items: Any, converters: Mapping[str, Callable[[str], Any]], where: str = "--sweep") -> list[Axis]:
    """`KEY=V1,V2` items (a string may hold several, separated by spaces), or a mapping key -> list of values
    (Python values as estimate() takes them; a string value is read as the text form)."""
    if isinstance(items, Mapping):
        pairs = [(str(key), value) for key, value in items.items()]
    else:
        texts = [items] if isinstance(items, str) else list(items or ())
        pairs = [_split_item(item, where) for text in texts for item in str(text).split()]
    axes: dict[str, Axis] = {}
    for typed, values in pairs:
        key = canonical_key(typed)
        blame = f"{where} {typed}={values if isinstance(values, str) else quote(values)}"
        if key not in SWEEP_KEYS:
            raise unknown_key(typed, SWEEP_KEYS | set(ALIASES), blame, "keys are the flags' names: batch, "
                              "precision, loop, optimizer, checkpointing, grad_accum, seq_len, device, …")
        if key in axes:
            raise SetupError(f"expected each key swept once, got {typed} twice", where=blame)
        axes[key] = _axis(key, typed, values, converters, blame, where)
    return list(axes.values())


def _split_item(item: str, where: str) -> tuple[str, str]:
    key, sign, values = item.partition("=")
    if not sign or not key.strip():
        raise SetupError(f"expected KEY=V1,V2 such as batch=1,2,4, got {quote(item)}", where=where)
    return key, values


def _axis(key: str, typed: str, values: Any, converters: Mapping[str, Callable[[str], Any]], blame: str,
          where: str) -> Axis:
    if isinstance(values, str):
        if key in TEXT_REFUSED:
            raise SetupError(f"expected a key whose values hold no commas on the command line, got {typed} (sweep "
                             f"it from Python: trainmem.sweep(…, over={{'{key}': [...]}}))", where=blame)
        texts = [text.strip() for text in values.split(",")]
        if not all(texts):
            raise SetupError("expected values separated by single commas, got an empty value", where=blame)
        convert = converters.get(key, str)
        converted = [_convert(convert, text, f"{where} {typed}={text}") for text in texts]
    elif isinstance(values, Sequence) and not isinstance(values, (bytes, bytearray)):
        converted, texts = list(values), [str(value) for value in values]
    else:
        raise SetupError(f"expected a list of values, got {quote(values)}", where=blame)
    if not converted:
        raise SetupError("expected at least one value, got none", where=blame)
    if len(set(texts)) != len(texts):
        raise SetupError(f"expected distinct values, got {', '.join(texts)}", where=blame)
    return Axis(key, typed.strip(), tuple(converted), tuple(texts))


def _convert(convert: Callable[[str], Any], text: str, blame: str) -> Any:
    try:
        return convert(text)
    except argparse.ArgumentTypeError as error:  # a flag's own parser says what it expects
        raise SetupError(str(error), where=blame) from None
    except (TypeError, ValueError):
        raise SetupError(f"expected {_expects(convert)}, got {quote(text)}", where=blame) from None


def _expects(convert: Callable[[str], Any]) -> str:
    return {int: "a whole number", float: "a number"}.get(convert, "a value the flag takes")


def check_count(models: Sequence[Any], axes: Sequence[Axis], limit: int = MAX_CONFIGURATIONS,
                where: str = "--sweep") -> int:
    sizes = [len(models)] + [len(axis.values) for axis in axes]
    count = 1
    for size in sizes:
        count *= size
    if count > limit:
        product = " × ".join(map(str, sizes))
        raise SetupError(f"expected at most {limit} configurations (models × each key's values), got {product} = "
                         f"{count:,}; sweep fewer values", where=where)
    return count


def grid(models: Sequence[Any], axes: Sequence[Axis]) -> list[tuple[Any, tuple[tuple[Axis, int], ...]]]:
    """Every (model, choice of one value per axis), models outermost, the last axis fastest."""
    choices = itertools.product(*(range(len(axis.values)) for axis in axes))
    return [(model, tuple(zip(axes, choice))) for model, choice in itertools.product(models, list(choices))]


def label_of(model: Any, many_models: bool, picked: Sequence[tuple[Axis, int]]) -> tuple[tuple[str, str], ...]:
    label = (("model", model_name(model)),) if many_models else ()
    return label + tuple((axis.shown, axis.texts[index]) for axis, index in picked)


def model_name(model: Any) -> str:
    return model.strip() if isinstance(model, str) else type(model).__name__


# ---- running ---------------------------------------------------------------------------------------------


class _Sources:
    """Each model resolved once per distinct setup (batch size aside: a source builds any batch), as
    estimate() resolves it once for both loops and fit once for every candidate. A Keras model is passed on
    as its reference (estimate() resolves it its own way)."""

    def __init__(self) -> None:
        self.cache: dict[tuple[int, str], Any] = {}

    def of(self, model: Any, setup: TrainingSetup) -> Any:
        from trainmem.frontends import ModelSource
        from trainmem.frontends.framework import is_keras_reference, resolve_model

        if is_keras_reference(model):
            return model
        key = (id(model), repr(dataclasses.replace(setup, batch_size=1)))
        if key not in self.cache:
            source = resolve_model(model, setup)
            self.cache[key] = source if isinstance(source, ModelSource) else model
        return self.cache[key]


class _Largest:
    """The largest batch that fits each device, by fit's search; traces shared between devices that trace
    alike and between configurations that differ only in batch size or device."""

    def __init__(self, budgets: Sequence[DeviceBudget], limit: int = FIT_LIMIT) -> None:
        self.budgets, self.limit = budgets, limit
        self.traces: dict[tuple, dict[int, Any]] = {}  # (setup, trace key) -> batch -> TraceResult
        self.answers: dict[tuple, LargestBatch] = {}

    def of(self, config: Configuration, source: Any) -> dict[str, LargestBatch]:
        from trainmem.frontends import ModelSource

        if not isinstance(source, ModelSource):
            raise SetupError(f"expected a PyTorch model with --devices (fit searches PyTorch models), got "
                             f"{quote(model_name(config.model))}", where="--devices")
        setup_key = repr(dataclasses.replace(config.setup, batch_size=1))
        target_options = config.options.cuda()
        out = {}
        for budget in self.budgets:
            key = (id(source), setup_key, budget.name, repr(sorted(target_options.items())))
            if key not in self.answers:
                try:
                    self.answers[key] = self._search(config, source, setup_key, budget, target_options)
                except Exception as error:  # noqa: BLE001 - this device cannot run the configuration (bf16 on a
                    # T4), or its search failed: the configuration's own figures and the other devices' answers stand
                    self.answers[key] = LargestBatch(None, None, "", failure_reason(error))
            out[budget.name] = self.answers[key]
        return out

    def _search(self, config: Configuration, source: Any, setup_key: str, budget: DeviceBudget,
                target_options: dict[str, Any]) -> LargestBatch:
        from trainmem.fit import ScaledBatches, fit, search

        if config.setup.parallel.distributed:  # per-rank estimates: fit's own path (every candidate traced)
            found = fit(source, config.setup, budget.device, margin=budget.margin, limit=self.limit,
                        target_options=TargetOptions(**target_options))
            return LargestBatch(found.best, found.first_miss, found.search.get("how", ""), failed=tuple(found.failed))
        candidates = ScaledBatches(source, config.setup, budget.device, {"depth": 2, **target_options}, self.limit)
        target = candidates.prepared.target
        trace_key = (setup_key, id(source), type(target).__name__, target.kernel_ops(), target.trace_semantics())
        candidates.real = self.traces.setdefault(trace_key, {})  # the traces this device shares with others
        found = search(candidates, self.limit, budget.budget_bytes)
        found.raise_if_nothing_evaluated("batch size", "--devices")
        return LargestBatch(found.best, found.first_miss, candidates.summary()["how"],
                            failed=tuple(sorted(found.failed.items())))


def device_budgets(devices: Any, margin: float | None) -> tuple[DeviceBudget, ...]:
    from trainmem.devices import get_device
    from trainmem.fit import budget_of, resolve_margin

    names = [d.strip() for d in devices.split(",")] if isinstance(devices, str) else list(devices or ())
    out = []
    for name in names:
        try:
            device = get_device(name)
        except TrainmemError as error:
            raise SetupError(error.message, where="--devices") from None
        kept = resolve_margin(margin, device)
        if device.name not in {b.name for b in out}:
            out.append(DeviceBudget(device, kept.fraction, kept.source, budget_of(device.capacity_bytes, kept)))
    return tuple(out)


def run(configurations: Sequence[Configuration], columns: Sequence[str], budgets: Sequence[DeviceBudget] = (),
        time_limit: float | None = None, progress: Any = None, warnings: Sequence[str] = ()) -> SweepResult:
    """Estimate each configuration in order (and its largest batch per device); past `time_limit` seconds the
    rest are listed as not evaluated. A configuration whose trace fails is listed as failed with its one-line
    reason; when every configuration reached failed, NothingEvaluated says why (an error is no answer)."""
    from trainmem.estimate import estimate
    from trainmem.progress import Progress

    if time_limit is not None and (isinstance(time_limit, bool) or not isinstance(time_limit, (int, float))
                                   or not time_limit > 0):
        raise SetupError(f"expected seconds above 0, got {quote(time_limit)}", where="--time-limit")
    started = time.perf_counter()
    sources, largest, rows = _Sources(), _Largest(budgets), []
    for config in {id(c.model): c for c in configurations}.values():  # one configuration per model
        sources.of(config.model, config.setup)  # a reference that does not resolve fails now, before any trace
    with (progress or Progress("compare: configurations", unit="configuration")) as bar:
        bar.total(len(configurations))
        for config in configurations:
            if time_limit is not None and time.perf_counter() - started > time_limit:
                rows.append(SweepRow(config.label, model_name(config.model), config.device, config.setup, None, {},
                                     "not evaluated"))
                bar.advance()
                continue
            try:
                source = sources.of(config.model, config.setup)
                est = estimate(source, setup=config.setup, device=config.device, target_options=config.options)
                found = largest.of(config, source) if budgets else {}
                rows.append(SweepRow(config.label, model_name(config.model), est.device.name, config.setup, est, found))
            except Exception as error:  # noqa: BLE001 - listed as failed with why, never as not fitting
                rows.append(SweepRow(config.label, model_name(config.model), config.device, config.setup, None, {},
                                     "failed", failure_reason(error)))
            bar.advance()
    result = SweepResult(tuple(columns), tuple(rows), tuple(budgets), time.perf_counter() - started, time_limit,
                         tuple(warnings))
    if result.failed and not result.estimated:
        waiting = len(rows) - len(result.failed)
        raise NothingEvaluated(result.failures, "configuration", "configurations",
                               also=f"{waiting:,} not evaluated within the time limit" if waiting else "")
    return result


# ---- the Python API ----------------------------------------------------------------------------------------


def sweep(models: Any, over: Any = None, *, setup: TrainingSetup | None = None, device: str | None = None,
          devices: Any = None, margin: float | None = None, time_limit: float | None = None,
          max_configurations: int = MAX_CONFIGURATIONS, progress: Any = None,
          target_options: TargetOptions | Mapping[str, Any] | None = None, **setup_values: Any) -> SweepResult:
    """Estimate every model (a reference or a list of them) at every combination of the swept values.

    `over` is `{"batch_size": [1, 2, 4], "precision": ["fp32", "bf16-mixed"]}` or the CLI's text,
    "batch=1,2,4 precision=fp32,bf16-mixed"; keys are the setup's (as estimate() takes them) and the run's
    (device, alloc_conf, …). `target_options` and the other keywords fix how the target runs and the setup, as
    in estimate(). `devices` ("a100-40gb,h100-80gb"
    or a list) adds the largest batch that fits each, as trainmem.fit finds it (keeping `margin`, fit's
    default otherwise). Past `time_limit` seconds the remaining configurations are not evaluated."""
    models = [models] if isinstance(models, str) or not isinstance(models, Sequence) else list(models)
    if not models:
        raise SetupError("expected at least one model, got none", where="sweep()")
    refuse_loose_options(setup_values, "sweep()")
    fixed_options = TargetOptions.of(target_options, "sweep()")
    axes = parse_sweep(over, _text_converters(over), where="sweep()")
    for axis in axes:
        if axis.key in setup_values or (axis.key == "device" and device is not None) or \
                (axis.key in TargetOptions.CUDA_KEYS and getattr(fixed_options, axis.key) is not None):
            raise SetupError(f"expected {axis.key}= or a sweep over {axis.shown}, got both", where="sweep()")
    check_count(models, axes, max_configurations, where="sweep()")
    budgets = device_budgets(devices, margin)
    fixed_run = {"device": device or "cpu"}
    base = _base_values(setup, setup_values)
    configs = []
    for model, picked in grid(models, axes):
        chosen = {axis.key: axis.values[index] for axis, index in picked}
        run_values = {**fixed_run, **{k: v for k, v in chosen.items() if k in RUN_KEYS}}
        built = _setup_from({**base, **{k: v for k, v in chosen.items() if k not in RUN_KEYS}}, picked)
        device_here = run_values.pop("device")
        configs.append(Configuration(model, label_of(model, len(models) > 1, picked), built, device_here,
                                     fixed_options.with_values(**run_values)))
    columns = (["model"] if len(models) > 1 else []) + [axis.shown for axis in axes]
    return run(configs, columns, budgets, time_limit, progress)


def compare_setups(models: Any, setups: Any, *, device: str = "cpu", devices: Any = None,
                   margin: float | None = None, time_limit: float | None = None, progress: Any = None) -> SweepResult:
    """Estimate each model with each setup: `setups` a mapping name -> TrainingSetup (or its values as a
    dict), or a list of them (named "setup 1", "setup 2", …)."""
    models = [models] if isinstance(models, str) or not isinstance(models, Sequence) else list(models)
    named = dict(setups) if isinstance(setups, Mapping) else {f"setup {i}": s for i, s in enumerate(setups, 1)}
    if not models or not named:
        raise SetupError("expected at least one model and one setup, got none", where="compare_setups()")
    if len(models) * len(named) > MAX_CONFIGURATIONS:
        raise SetupError(f"expected at most {MAX_CONFIGURATIONS} configurations, got {len(models) * len(named):,}",
                         where="compare_setups()")
    budgets = device_budgets(devices, margin)
    configs = []
    for model in models:
        for name, given in named.items():
            built = given if isinstance(given, TrainingSetup) else \
                TrainingSetup.from_mapping(dict(given), where=f"compare_setups() {name}")
            label = ((("model", model_name(model)),) if len(models) > 1 else ()) + (("setup", str(name)),)
            configs.append(Configuration(model, label, built, device, TargetOptions()))
    return run(configs, (["model"] if len(models) > 1 else []) + ["setup"], budgets, time_limit, progress)


def _text_converters(over: Any) -> Mapping[str, Callable[[str], Any]]:
    """Each key's reader of text (setup/text_values.py, the flags' own), for the text form."""
    if over is None or isinstance(over, Mapping) and not any(isinstance(v, str) for v in over.values()):
        return {}
    from trainmem.setup.text_values import TEXT_VALUES

    return TEXT_VALUES


def _base_values(setup: TrainingSetup | None, setup_values: dict[str, Any]) -> dict[str, Any]:
    if setup is not None and not isinstance(setup, TrainingSetup):
        raise SetupError(f"expected setup= as a trainmem.TrainingSetup, got {type(setup).__name__}", where="sweep()")
    base = {} if setup is None else {f.name: getattr(setup, f.name) for f in dataclasses.fields(setup)}
    if setup is not None and not setup.parallel.distributed:
        base.pop("parallel")  # flat layout keys (strategy=…) may then be swept or given
    return {**base, **setup_values}


def _setup_from(values: dict[str, Any], picked: Sequence[tuple[Axis, int]]) -> TrainingSetup:
    origins = {key: f"sweep({key}=…)" for key in values}
    origins.update({axis.key: f"sweep() {axis.shown}={axis.texts[index]}" for axis, index in picked})
    return TrainingSetup.from_mapping(values, where="sweep()", origins=origins)
