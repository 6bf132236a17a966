"""Which options apply to which run: one table, checked before anything is built or traced.

An option that does not apply to the model, the device or the command used to be dropped in silence:
`--seq-len 2048` on an mlp: reference, `--cuda-context` with `--device cpu`. Each row below says when
its option applies and what happens otherwise: refused (exit 2, one line naming the option, what it
needs and what was given) where the user surely meant something else and the estimate would answer
another question than theirs, or a warning on stderr where dropping it changes nothing they asked for.
Options come from flags or from a --setup file; a message names whichever it was. Nothing here imports torch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from trainmem.errors import SetupError, quote
from trainmem.frontends import Kind
from trainmem.frontends.framework import keras_by_text, may_be_keras_on_tensorflow
from trainmem.setup.target_options import TargetOptions

REFUSE, WARN = "refuse", "warn"
# options whose flag is not their key with dashes: the run's length is --steps (key run_steps), the traced steps
# the hidden --trace-steps (key steps, TrainingSetup.steps)
FLAG_OF_KEY = {"run_steps": "--steps", "steps": "--trace-steps"}


def flag_of(key: str) -> str:
    """The command-line flag of an option key."""
    return FLAG_OF_KEY.get(key, f"--{key.replace('_', '-')}")
# The CUDA stack of the target run (targets/cuda_target.py): meaningless for a CPU estimate.
CUDA_KEYS = TargetOptions.CUDA_KEYS
_INTEGER_DTYPES = ("int64", "int32", "uint8")


@dataclasses.dataclass(frozen=True)
class Invocation:
    """One run as the rules see it: the command, what the model reference is, the device, and every
    option the user gave (by flag or by file) with where it came from."""

    command: str  # estimate | measure | fit
    model: str  # the reference as given
    kind: str  # frontends.Kind of the reference
    device: str  # --device as given, "cpu" by default
    gpu: Any  # the catalog's GpuSpec for a catalog or custom: GPU; None for cpu (or measure's plain "cuda")
    values: Mapping[str, Any]  # option key -> value, only the options given
    origins: Mapping[str, str]  # option key -> "--seq-len" or "run.toml: seq_len"

    @property
    def on_gpu(self) -> bool:
        return self.device.strip().lower() != "cpu"

    def given(self, key: str) -> bool:
        return key in self.values


@dataclasses.dataclass(frozen=True)
class FlagRule:
    key: str  # the option's key (its flag with dashes as underscores)
    applies: Callable[[Invocation], bool]
    action: str  # REFUSE or WARN
    expected: str  # refused: what the option needs; warned: why it changes nothing
    got: Callable[[Invocation], str] = lambda run: quote(run.model)


def _integer_input(run: Invocation) -> bool:
    dtypes = run.values.get("input_dtype") or []
    dtypes = [dtypes] if isinstance(dtypes, str) else dtypes
    return any(str(dtype) in _INTEGER_DTYPES for dtype in dtypes)


def _layout_key(run: Invocation) -> str | None:
    """The first option that asks for more than one process (--strategy other than none, --tp/--pp/--world-size
    above 1), or None."""
    for key in ("strategy", "tp", "pp", "world_size"):
        value = run.values.get(key)
        if value is not None and str(value).strip().lower() not in ("none", "1"):
            return key
    return None


def _bf16_or_precision_given(run: Invocation) -> bool:
    return run.gpu is None or run.gpu.bf16 or run.given("precision")


def given_as(run: Invocation, key: str, value: Any) -> str:
    """An option's value as the user gave it, for a message's "got": "--device a100-40gb", "cpu (run.toml: device)",
    or "--device cpu (the default)" where the user gave none, so that a message never blames an untyped flag."""
    origin = run.origins.get(key)
    if origin is None:
        return f"{flag_of(key)} {value} (the default)"
    return f"{flag_of(key)} {value}" if origin == flag_of(key) else f"{value} ({origin})"


def _device_with_cc(run: Invocation) -> str:
    major, minor = run.gpu.compute_capability
    return f"{given_as(run, 'device', run.device)} (compute capability {major}.{minor})"


def _framework(run: Invocation) -> str:
    return str(run.values.get("framework", "auto")).strip().lower()


def keras_run(run: Invocation) -> bool:
    """Whether the run is a Keras model, as far as the text tells (frontends/framework.py keras_by_text)."""
    return keras_by_text(_framework(run), run.kind)


def _keras_on_tensorflow(run: Invocation) -> bool:
    return may_be_keras_on_tensorflow(_framework(run), run.kind, str(run.values.get("keras_backend", "tensorflow")))


_NOT_FOR_KERAS = (Kind.HF, Kind.VISION, Kind.ONNX, Kind.CHECKPOINT)
_DEVICE = lambda run: given_as(run, "device", run.device)  # noqa: E731
_MLP = lambda run: run.kind == Kind.MLP  # noqa: E731
_HF = lambda run: run.kind == Kind.HF  # noqa: E731
_GPU_MEASURE = lambda run: run.command == "measure" and run.on_gpu  # noqa: E731

RULES: tuple[FlagRule, ...] = (
    FlagRule("framework", lambda run: _framework(run) != "keras" or run.kind not in _NOT_FOR_KERAS, REFUSE,
             "a Keras model reference with --framework keras (model.keras, a SavedModel directory, file.py:factory, "
             "mlp:, a layer spec)"),
    FlagRule("framework", lambda run: run.command != "fit" or _framework(run) == "torch", REFUSE,
             "--framework torch with fit (fit searches PyTorch models; estimate a Keras model at the batch sizes you "
             "consider)", lambda run: quote(run.values["framework"])),
    FlagRule("framework", lambda run: run.command != "compare", REFUSE, "no --framework with compare (it estimates "
             "both frameworks)", lambda run: quote(run.values["framework"])),
    FlagRule("keras_backend", lambda run: _framework(run) != "torch" and run.command != "compare", REFUSE,
             "a Keras model (--framework auto or keras; compare uses TensorFlow)",
             lambda run: given_as(run, "framework", _framework(run)) if run.command != "compare" else "compare"),
    FlagRule("tf_memory", lambda run: run.on_gpu, REFUSE, "a GPU --device (--tf-memory sets how TensorFlow maps GPU "
             "memory)", _DEVICE),
    FlagRule("tf_memory", lambda run: _keras_on_tensorflow(run) or run.command == "compare", REFUSE,
             "a Keras model on TensorFlow (--tf-memory is TensorFlow's GPU memory mode; PyTorch's is --alloc-conf)"),
    FlagRule("tf_onednn", lambda run: not run.on_gpu, REFUSE, "--device cpu (--tf-onednn sets TensorFlow's CPU "
             "path: oneDNN and its MklCPUAllocator)", _DEVICE),
    FlagRule("tf_onednn", _keras_on_tensorflow, REFUSE, "a Keras model on TensorFlow (--tf-onednn is TensorFlow's "
             "oneDNN switch, TF_ENABLE_ONEDNN_OPTS)"),
    FlagRule("tf_onednn", lambda run: run.command == "estimate", REFUSE, "trainmem estimate (a measured run follows "
             "TF_ENABLE_ONEDNN_OPTS in its environment)", lambda run: run.command),
    FlagRule("dataset_size", lambda run: not run.on_gpu, REFUSE, "--device cpu (--dataset-size is the arrays "
             "model.fit holds in host RAM, part of peak RSS)", _DEVICE),
    FlagRule("dataset_size", _keras_on_tensorflow, REFUSE, "a Keras model on TensorFlow (--dataset-size is the data "
             "model.fit holds; a PyTorch loop's data is the user's)"),
    FlagRule("dataset_size", lambda run: run.command == "estimate", REFUSE, "trainmem estimate (a measured run "
             "makes its own arrays)", lambda run: run.command),
    FlagRule("seq_len", _HF, REFUSE, "an hf: model (--seq-len sets its tokens per sample; for other models "
             "the sequence length is part of --input-shape)"),
    FlagRule("task", _HF, REFUSE, "an hf: model (--task chooses its head and loss)"),
    FlagRule("trust_remote_code", _HF, WARN, "it applies to hf: models only"),
    FlagRule("activation", _MLP, REFUSE, "an mlp: model (--activation sets the activation between its layers; "
             "other models define their own)"),
    FlagRule("dropout", _MLP, REFUSE, "an mlp: model (--dropout adds Dropout between its layers; other models "
             "define their own)"),
    FlagRule("qlora", lambda run: run.on_gpu, REFUSE, "a GPU --device (QLoRA's 4-bit weights and paged 8-bit "
             "AdamW are bitsandbytes' CUDA kernels and CUDA managed memory)", _DEVICE),
    FlagRule("qlora", _bf16_or_precision_given, REFUSE, "a GPU with bf16 (compute capability 8.0 or newer) for "
             "QLoRA's bf16-mixed compute, or --precision fp16-mixed with it", _device_with_cc),
    # --compile traces Inductor's plan for the CPU (trace/compiled.py): a CUDA run's plan is Triton's, not made here
    FlagRule("compile", lambda run: not run.on_gpu, REFUSE, "--device cpu (--compile traces the plan Inductor makes "
             "for the CPU; a GPU run's Triton plan is not modelled yet)", _DEVICE),
    FlagRule("compile", lambda run: not keras_run(run), REFUSE, "a PyTorch model (--compile is torch.compile; "
             "Keras compiles with jit_compile)", lambda run: f"the Keras model {quote(run.model)}"),
    FlagRule("compile", lambda run: not run.values.get("checkpointing"), REFUSE, "no --checkpointing (a checkpointed "
             "block compiled by Inductor runs higher-order operators the trace does not take yet)",
             lambda run: given_as(run, "checkpointing", "on")),
    FlagRule("compile", lambda run: _layout_key(run) is None and run.command != "plan", REFUSE, "a one-process run "
             "(--compile with a --strategy, --tp, --pp or --world-size layout is not traced yet)",
             lambda run: run.command if _layout_key(run) is None else given_as(run, _layout_key(run),
                                                                                run.values[_layout_key(run)])),
    FlagRule("load", lambda run: not keras_run(run), REFUSE, "a PyTorch model (--load traces torch.load and "
             "load_state_dict)", lambda run: f"the Keras model {quote(run.model)}"),
    FlagRule("load", lambda run: run.command in ("estimate", "fit", "compare"), REFUSE, "trainmem estimate, fit or "
             "compare (--load is traced by the estimate; measure and plan do not load a checkpoint)",
             lambda run: f"trainmem {run.command}"),
    FlagRule("batch_size", lambda run: run.command != "fit" or bool(run.values.get("max_seq")), REFUSE,
             "no --batch-size with fit (fit searches the batch size; --batch-size fixes it for the sequence "
             "search, --max-seq)", lambda run: quote(run.values["batch_size"])),
    *(FlagRule(key, lambda run: run.on_gpu, REFUSE, f"a GPU --device (--{key.replace('_', '-')} describes "
               "the CUDA run)", _DEVICE) for key in CUDA_KEYS),
    FlagRule("input_max", _integer_input, WARN, "it bounds the values of integer inputs and every input "
             "here is floating point (--input-dtype)"),
    FlagRule("runs", lambda run: not _GPU_MEASURE(run), WARN, "a GPU measurement is one run in one fresh "
             "process (--runs repeats CPU runs for the median RSS)"),
    FlagRule("force", lambda run: not _GPU_MEASURE(run), WARN, "a GPU measurement runs whatever the estimate "
             "says"),
    FlagRule("format", lambda run: not _GPU_MEASURE(run), WARN, "a GPU measurement prints one JSON line"),
    FlagRule("depth", lambda run: run.command == "estimate" or (run.command == "measure" and not run.on_gpu),
             WARN, "only the estimate's report has per-module rows"),
    # a --setup file shared between commands may hold another command's options
    FlagRule("margin", lambda run: run.command in ("fit", "plan", "compare"), WARN,
             "only trainmem fit and plan keep a margin"),
    FlagRule("margin", lambda run: run.command != "compare" or run.given("devices"), WARN,
             "trainmem compare keeps a margin on the --devices it searches, and none was given"),
    FlagRule("sweep", lambda run: run.command == "compare", WARN, "only trainmem compare sweeps"),
    FlagRule("devices", lambda run: run.command == "compare", WARN, "only trainmem compare searches --devices"),
    FlagRule("max_seq", lambda run: run.command == "fit", WARN, "only trainmem fit searches"),
    FlagRule("runs", lambda run: run.command == "measure", WARN, "only trainmem measure runs the steps"),
    FlagRule("run_steps", lambda run: not run.on_gpu, WARN, "only CPU peak RSS depends on the run's length "
             "(the caching allocator's step repeats itself: a GPU estimate stands for any length)"),
    FlagRule("force", lambda run: run.command == "measure", WARN, "only trainmem measure runs the steps"),
    # the estimate's extra outputs (report/): they draw the allocator replay of a PyTorch trace
    FlagRule("plot", lambda run: run.command in ("estimate", "compare"), WARN,
             "only trainmem estimate and compare draw plots"),
    *(FlagRule(key, lambda run: run.command == "estimate", WARN, f"only trainmem estimate writes --{flag}")
      for key, flag in (("html", "html"), ("memory_snapshot", "memory-snapshot"),
                        ("snapshot_max_entries", "snapshot-max-entries"), ("quiet", "quiet"))),
    *(FlagRule(key, lambda run: run.command != "estimate" or not keras_run(run), REFUSE,
               f"a PyTorch model (--{flag} draws the replay of a PyTorch trace; a Keras estimate keeps none)",
               lambda run: f"the Keras model {quote(run.model)}")
      for key, flag in (("plot", "plot"), ("html", "html"), ("memory_snapshot", "memory-snapshot"))),
    FlagRule("memory_snapshot", lambda run: run.on_gpu, REFUSE, "a GPU --device (a memory snapshot is the "
             "history of PyTorch's CUDA caching allocator, as memory_viz reads it)", _DEVICE),
    # compare's own options, in a --setup file shared with another command
    FlagRule("sweep", lambda run: run.command == "compare", WARN, "only trainmem compare sweeps"),
    FlagRule("devices", lambda run: run.command == "compare", WARN, "only trainmem compare searches per device"),
    FlagRule("snapshot_max_entries", lambda run: run.given("memory_snapshot"), WARN,
             "it caps --memory-snapshot, which was not given"),
)


def check(run: Invocation, rules: tuple[FlagRule, ...] = RULES) -> list[str]:
    """Raise for the first given option a REFUSE row does not allow; return a warning line for each
    given option a WARN row does not allow (the caller prints them on stderr)."""
    warnings: list[str] = []
    for rule in rules:
        # a switch turned off (--no-qlora over a setup file's qlora = true) asks for nothing its rules check
        if not run.given(rule.key) or run.values[rule.key] is False or rule.applies(run):
            continue
        where = run.origins.get(rule.key, flag_of(rule.key))
        if rule.action == REFUSE:
            raise SetupError(f"expected {rule.expected}, got {rule.got(run)}", where=where)
        line = f"warning: {where}: ignored: {rule.expected}"
        if line not in warnings:
            warnings.append(line)
    return warnings


def explicit(values: Mapping[str, Any]) -> dict[str, Any]:
    """The options a user actually gave: argparse's None (and store_true's None) mean 'not given'."""
    return {key: value for key, value in values.items() if value is not None}
