"""One command's options: the flags over a --setup file over the run defaults, merged into a frozen `Options`,
checked before anything is built or traced, and turned into a TrainingSetup."""

from __future__ import annotations

import argparse
import copy
import dataclasses
import os
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from trainmem.errors import TrainmemError, quote, unknown_key
# --max-grad-norm none (or max_grad_norm = "none" in a --setup file): no clipping, even where --hf-trainer clips
from trainmem.setup.text_values import NO_CLIPPING

# Run options: what the command does with the setup. Their defaults are applied after the flags and
# the --setup file are merged (argparse's own defaults are None, so that "not given" can be told apart
# from "given as the default": a file's device is overridden only by a --device the user typed).
RUN_DEFAULTS: dict[str, Any] = {"device": "cpu", "format": "table", "depth": 2, "runs": 1, "force": False,
                                "max_seq": False, "margin": None, "framework": "auto", "keras_backend": None,
                                "tf_memory": None, "plot": None, "html": None, "memory_snapshot": None,
                                "snapshot_max_entries": None, "quiet": False, "tf_onednn": None,
                                "no_cache": False}
NOT_OPTIONS = {"command", "model", "setup", "debug"}
# measure --runs starts one fresh process per run (seconds each, the model's memory each): the median
# of peak RSS settles within a few runs (benchmarks run 3); 20 is room for a careful user, while a
# million would measure for days.
MAX_RUNS = 20

@dataclasses.dataclass(frozen=True)
class Options:
    """Every option of one command, merged; `given` holds only what the user gave, `origins` where. Frozen all
    the way down: the three tables are read-only views, and `with_values` makes a new Options."""

    values: Mapping[str, Any]
    given: Mapping[str, Any]
    origins: Mapping[str, str]

    def __post_init__(self) -> None:
        for name in ("values", "given", "origins"):
            object.__setattr__(self, name, MappingProxyType(dict(getattr(self, name))))

    def with_values(self, **more: Any) -> Options:
        """The same options with run values added (not given by the user: `given` and `origins` unchanged)."""
        return Options({**self.values, **more}, self.given, self.origins)

    def __getattr__(self, name: str) -> Any:
        try:
            return self.values[name]
        except KeyError:
            raise AttributeError(name) from None


def option_keys(parser: argparse.ArgumentParser) -> set[str]:
    """The keys a --setup file may hold: every command's flags (a file may be shared between commands)."""
    keys: set[str] = set()
    for action in parser._subparsers._group_actions[0].choices.values():  # noqa: SLF001 - argparse's own table
        keys |= {a.dest for a in action._actions if a.dest not in NOT_OPTIONS and a.dest != "help"}  # noqa: SLF001
    return keys


# The environment's allocator settings, in the order c10's CUDAAllocatorConfig reads them (torch 2.13,
# c10/cuda/CUDAAllocatorConfig.h: PYTORCH_CUDA_ALLOC_CONF, then PYTORCH_ALLOC_CONF): the run the user estimates
# takes them, so the estimate does too unless --alloc-conf (or a --setup file) says otherwise.
ALLOC_CONF_VARIABLES = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")
# TensorFlow's GPU settings in the environment, as TensorFlow 2.21 reads them (exact text, no case folding):
# TF_FORCE_GPU_ALLOW_GROWTH (common_runtime/gpu/gpu_bfc_allocator.cc GetAllowGrowthValue: "true" or "false"
# replaces the config's allow_growth; any other text is logged as an error and ignored), the memory mode unless
# --tf-memory (or a --setup file's tf_memory) gives one; and TF_GPU_ALLOCATOR (gpu_process_state.cc: the three
# values below change the allocator, any other text leaves the BFC allocator).
TF_GROWTH_VARIABLE = "TF_FORCE_GPU_ALLOW_GROWTH"
TF_GROWTH_MODES = {"true": "growth", "false": "default"}
TF_ALLOCATOR_VARIABLE = "TF_GPU_ALLOCATOR"
# Every allocator TF_GPU_ALLOCATOR can choose is refused, not noted on stderr: what it changes is what a Keras GPU
# answer leads with (the BFC regions, nvidia-smi), so a line beside BFC figures would come after a wrong
# headline; PyTorch's counterpart (backend:cudaMallocAsync) is refused the same way (targets/cuda_target.py).
# The refusal says how to get the BFC allocator's figures. Other text is refused as a likely misspelling.
TF_ALLOCATORS = {"cuda_malloc_async": "TensorFlow would allocate from cudaMallocAsync's stream-ordered pool",
                 "cuda_malloc": "TensorFlow would cudaMalloc every tensor (a debugging allocator)",
                 "memory_guard": "TensorFlow would wrap the BFC allocator in GPUDebugAllocator's guard bytes (a "
                                 "debugging allocator)"}
ENVIRONMENT = " in the environment"


def with_environment(options: Options, command: str = "estimate") -> Options:
    """The options with the settings of the environment where none were given, on a GPU --device (on the CPU
    they mean nothing): TensorFlow's for a Keras model on TensorFlow (and compare's Keras side), PyTorch's
    allocator settings for the rest (Keras on the torch backend trains on PyTorch's allocator); neither
    framework reads the other's. `origins` names the variable, so a message about a setting names it too."""
    if str(options.values.get("device", "cpu")).strip().lower() == "cpu":
        return options
    keras_on_tensorflow = _keras_on_tensorflow(options)
    if keras_on_tensorflow or command == "compare":
        options = _with_tensorflow_environment(options)
    return options if keras_on_tensorflow else _with_torch_environment(options)


def _keras_on_tensorflow(options: Options) -> bool:
    """Whether the model is Keras on TensorFlow, from its reference's text, a stat and a factory file's import
    lines (cli/commands/measure.py keras_factory_file), before anything is imported or run. Keras's backend:
    --keras-backend, else KERAS_BACKEND as Keras reads it (its ~/.keras/keras.json is not read here)."""
    from trainmem.cli.commands.measure import keras_factory_file
    from trainmem.frontends.framework import is_keras_reference

    backend = options.values.get("keras_backend") or os.environ.get("KERAS_BACKEND", "").strip() or "tensorflow"
    if backend != "tensorflow" or not isinstance(options.values.get("model"), str):
        return False
    return is_keras_reference(options.model, options.values.get("framework", "auto")) or keras_factory_file(options)


def _with_torch_environment(options: Options) -> Options:
    if "alloc_conf" in options.given:
        return options
    for name in ALLOC_CONF_VARIABLES:
        value = os.environ.get(name, "").strip()
        if value:
            _check_environment_alloc_conf(name, value)
            return Options({**options.values, "alloc_conf": value}, {**options.given, "alloc_conf": value},
                           {**options.origins, "alloc_conf": name + ENVIRONMENT})
    return options


def _with_tensorflow_environment(options: Options) -> Options:
    allocator = os.environ.get(TF_ALLOCATOR_VARIABLE, "")
    if allocator.strip():
        _refuse_tf_allocator(allocator)
    value = os.environ.get(TF_GROWTH_VARIABLE, "")
    if "tf_memory" in options.given or not value.strip():  # empty: TensorFlow keeps the config's, as unset
        return options
    mode = TF_GROWTH_MODES.get(value)
    if mode is None:
        raise TrainmemError(f"expected true or false (TensorFlow reads exactly these, in lower case, and ignores "
                            f"any other value), got {quote(value)}", where=TF_GROWTH_VARIABLE + ENVIRONMENT)
    return Options({**options.values, "tf_memory": mode}, {**options.given, "tf_memory": mode},
                   {**options.origins, "tf_memory": f"{TF_GROWTH_VARIABLE}={value}{ENVIRONMENT}"})


def _refuse_tf_allocator(value: str) -> None:
    where = TF_ALLOCATOR_VARIABLE + ENVIRONMENT
    if value not in TF_ALLOCATORS:
        raise TrainmemError(f"expected one of TensorFlow's values ({', '.join(TF_ALLOCATORS)}) or none, got "
                            f"{quote(value)} (TensorFlow would ignore it and keep its BFC allocator: unset it or "
                            "correct it)", where=where)
    raise TrainmemError(f"expected TensorFlow's BFC allocator (the one trainmem models), got {value}: "
                        f"{TF_ALLOCATORS[value]}; for the BFC allocator's figures run trainmem without it "
                        f"(env -u {TF_ALLOCATOR_VARIABLE} trainmem …)", where=where)


def _check_environment_alloc_conf(name: str, value: str) -> None:
    """Refuse bad settings naming the variable (the target's own check, on the value passed on, would blame
    --alloc-conf)."""
    from trainmem.targets.cuda_target import allocator_config

    allocator_config(value, name + ENVIRONMENT, "allocator", "; --alloc-conf overrides the environment")


def environment_notes(options: Options) -> list[str]:
    """One line for each setting taken from the environment (printed on stderr with the warnings)."""
    notes = []
    if options.origins.get("alloc_conf", "").endswith(ENVIRONMENT):
        notes.append(f"allocator settings {options.values['alloc_conf']!r} from {options.origins['alloc_conf']} "
                     "(--alloc-conf overrides them)")
    if options.origins.get("tf_memory", "").endswith(ENVIRONMENT):
        notes.append(f"TensorFlow GPU memory mode {options.values['tf_memory']!r} from {options.origins['tf_memory']}"
                     " (--tf-memory overrides it)")
    return notes


def merge_options(args: argparse.Namespace, file_keys: set[str]) -> Options:
    from trainmem.flag_rules import explicit, flag_of
    from trainmem.setup import read_setup_file

    given: dict[str, Any] = {}
    origins: dict[str, str] = {}
    if args.setup:
        table = read_setup_file(args.setup)
        unknown = sorted(set(table) - file_keys)
        if unknown:
            raise unknown_key(unknown[0], file_keys, args.setup, "keys are the flags' names with underscores, "
                              f"see trainmem {args.command} --help")
        given.update(table)
        origins.update({key: f"{args.setup}: {key}" for key in table})
    flags = explicit({key: value for key, value in vars(args).items() if key not in NOT_OPTIONS})
    if "input_shape" in flags:  # the flags' inputs replace the file's whole
        for key in ("input_shape", "input_dtype", "input_max"):
            given.pop(key, None)
    given.update(flags)
    origins.update({key: flag_of(key) for key in flags})
    return Options({**RUN_DEFAULTS, **given}, given, origins)


def aimed_at_origin(error: TrainmemError, origins: Mapping[str, str]) -> TrainmemError:
    """An error raised while the command ran (a trace, a target) that blames a flag ('--batch-size …'), re-aimed at
    where the value came from when the user did not type that flag (a --setup file's key): the same error, copied."""
    from trainmem.flag_rules import FLAG_OF_KEY

    flag = (error.where or "").split(" ")[0]
    key = {shown: key for key, shown in FLAG_OF_KEY.items()}.get(flag) or flag.removeprefix("--").replace("-", "_")
    origin = origins.get(key)
    if not flag.startswith("--") or origin is None or origin == flag:
        return error
    aimed = copy.copy(error)
    aimed.where, aimed.args = origin, (f"{origin}: {error.message}",)
    return aimed


def timeout_words(timeout: float, origin: str | None) -> str:
    """The time limit as the user set it, for the line that says it was reached (supervised.py)."""
    if origin is None:
        return f"--timeout {timeout:g} s (the default)"
    return f"--timeout {timeout:g} s" if origin == "--timeout" else f"{timeout:g} s ({origin})"


def setup_from_options(options: Options):
    from trainmem.setup import SETUP_KEYS, TrainingSetup

    values = {key: value for key, value in options.given.items() if key in SETUP_KEYS}
    if values.get("max_grad_norm") == NO_CLIPPING:  # None given, not left out: it wins over a preset's norm
        values["max_grad_norm"] = None
    if ("input_dtype" in values or "input_max" in values) and "input_shape" not in values:
        raise TrainmemError("expected --input-shape with --input-dtype/--input-max, got none",
                            where=options.origins.get("input_dtype") or options.origins.get("input_max"))
    return TrainingSetup.from_mapping(values, where="command line", origins=options.origins)


def check_run_options(options: Options, command: str) -> list[str]:
    """The run options' own checks, then the table of which options apply (flag_rules.py)."""
    from trainmem.devices import get_device
    from trainmem.flag_rules import Invocation, check, flag_of
    from trainmem.frontends import reference_kind

    where = lambda key: options.origins.get(key, flag_of(key))  # noqa: E731
    for key in ("device", "format"):
        if not isinstance(options.values[key], str):
            raise TrainmemError(f"expected text, got {quote(options.values[key])}", where=where(key))
    if options.format not in ("table", "json"):
        raise TrainmemError(f"expected table or json, got {quote(options.format)}", where=where("format"))
    for key in ("depth", "runs"):
        value = options.values[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise TrainmemError(f"expected a whole number of at least 1, got {quote(value)}", where=where(key))
    if options.runs > MAX_RUNS:
        raise TrainmemError(f"expected at most {MAX_RUNS} runs, got {options.runs:,}", where=where("runs"))
    check_trace_steps(options, where)
    check_framework_options(options, where)
    check_output_options(options)
    device = options.device
    try:
        gpu = None if device.strip().lower() in ("cpu", "cuda") else get_device(device).gpu
    except TrainmemError as error:
        raise TrainmemError(getattr(error, "message", str(error)), where=where("device")) from None
    run = Invocation(command, options.model, reference_kind(options.model), device, gpu, options.given, options.origins)
    return check(run)


def check_trace_steps(options: Options, where) -> None:
    """The hidden --trace-steps (key steps): at most MAX_TRACE_STEPS traced, refused before the first; the
    Python API's bound (TrainingSetup) is the longer one measure's real runs need."""
    from trainmem.setup import MAX_TRACE_STEPS

    steps = options.given.get("steps")
    if isinstance(steps, int) and not isinstance(steps, bool) and steps > MAX_TRACE_STEPS:
        raise TrainmemError(f"expected at most {MAX_TRACE_STEPS} traced steps (two are enough: later steps are "
                            f"composed from them), got {steps:,}", where=where("steps"))


def check_framework_options(options: Options, where) -> None:
    """--framework, --keras-backend and --tf-memory values, from flags or a --setup file; which runs they
    apply to is flag_rules.py's table."""
    from trainmem.frontends.framework import FRAMEWORKS, KERAS_BACKENDS

    for key, choices in (("framework", FRAMEWORKS), ("keras_backend", KERAS_BACKENDS)):
        value = options.values[key]
        if value is not None and value not in choices:
            raise TrainmemError(f"expected {'|'.join(choices)}, got {quote(value)}", where=where(key))
    if options.tf_onednn is not None and options.tf_onednn not in ("auto", "on", "off"):
        raise TrainmemError(f"expected auto|on|off, got {quote(options.tf_onednn)}", where=where("tf_onednn"))
    if options.tf_memory is not None:
        from trainmem.targets.tf.gpu_memory import parse_mode

        if not isinstance(options.tf_memory, str):
            raise TrainmemError(f"expected text, got {quote(options.tf_memory)}", where=where("tf_memory"))
        try:
            parse_mode(options.tf_memory)
        except TrainmemError as error:
            raise TrainmemError(error.message, where=where("tf_memory")) from None


def gpu_options(options: Options) -> dict[str, Any]:
    """The CUDA target's options given (flags, TOML), read: --cuda-context's size in bytes."""
    from trainmem.setup.target_options import TargetOptions
    from trainmem.units import parse_bytes

    chosen = {key: options.given[key] for key in TargetOptions.CUDA_KEYS if key in options.given}
    if "cuda_context" in chosen:
        chosen["cuda_context"] = parse_bytes(str(chosen["cuda_context"]), options.origins["cuda_context"])
    return chosen


def target_options(options: Options) -> Any:
    """How the target runs (setup/target_options.py TargetOptions): the CUDA options given and TensorFlow's."""
    from trainmem.setup.target_options import TargetOptions

    return TargetOptions(**gpu_options(options), tf_memory=options.tf_memory, tf_onednn=options.tf_onednn,
                         dataset_size=options.values.get("dataset_size"))


def output_paths(options: Options) -> dict[str, str]:
    """The output files given (--plot, --html, --memory-snapshot), each checked and made absolute against the
    current directory (cli/output_files.py): key → path."""
    from trainmem.cli.output_files import output_paths as checked
    from trainmem.flag_rules import flag_of

    return checked(options.values, lambda key: options.origins.get(key, flag_of(key)))


def with_output_paths(options: Options) -> Options:
    """The options with `output_paths` added: run while the flags are read, before the model's code can change
    the working directory, so that a relative path means the directory trainmem started in."""
    return options.with_values(output_paths=output_paths(options))


def check_output_options(options: Options) -> None:
    """The output files' names and the snapshot's cap, checked before anything is traced."""
    from trainmem.flag_rules import flag_of

    where = lambda key: options.origins.get(key, flag_of(key))  # noqa: E731
    output_paths(options)
    limit = options.snapshot_max_entries
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise TrainmemError(f"expected a whole number of at least 1, got {quote(limit)}",
                            where=where("snapshot_max_entries"))
    if options.quiet and options.given.get("format") == "json":
        raise TrainmemError("expected --quiet or --format json, got both", where=where("quiet"))


def framework_options(options: Options) -> dict[str, Any]:
    return {"framework": options.framework, "keras_backend": options.keras_backend}
