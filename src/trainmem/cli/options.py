"""One command's options: the flags over a --setup file over the run defaults, merged into a frozen `Options`,
checked before anything is built or traced, and turned into a TrainingSetup."""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from trainmem.errors import TrainmemError, quote, unknown_key

# Run options: what the command does with the setup. Their defaults are applied after the flags and
# the --setup file are merged (argparse's own defaults are None, so that "not given" can be told apart
# from "given as the default": a file's device is overridden only by a --device the user typed).
RUN_DEFAULTS: dict[str, Any] = {"device": "cpu", "format": "table", "depth": 2, "runs": 1, "force": False,
                                "max_seq": False, "margin": None, "framework": "auto", "keras_backend": None,
                                "tf_memory": None, "plot": None, "html": None, "memory_snapshot": None,
                                "snapshot_max_entries": None, "quiet": False, "tf_onednn": None}
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


def with_environment(options: Options) -> Options:
    """The options with the allocator settings of the environment where none were given, on a GPU --device
    (on the CPU they mean nothing); `origins` names the variable, so a message about them names it too."""
    if "alloc_conf" in options.given or str(options.values.get("device", "cpu")).strip().lower() == "cpu":
        return options
    for name in ALLOC_CONF_VARIABLES:
        value = os.environ.get(name, "").strip()
        if value:
            _check_environment_alloc_conf(name, value)
            return Options({**options.values, "alloc_conf": value}, {**options.given, "alloc_conf": value},
                           {**options.origins, "alloc_conf": f"{name} in the environment"})
    return options


def _check_environment_alloc_conf(name: str, value: str) -> None:
    """Refuse bad settings naming the variable (the target's own check, on the value passed on, would blame
    --alloc-conf)."""
    from trainmem.targets.cuda_target import allocator_config

    allocator_config(value, f"{name} in the environment", "allocator", "; --alloc-conf overrides the environment")


def environment_notes(options: Options) -> list[str]:
    """One line for each setting taken from the environment (printed on stderr with the warnings)."""
    origin = options.origins.get("alloc_conf", "")
    if origin.endswith(" in the environment"):
        return [f"allocator settings {options.values['alloc_conf']!r} from {origin} (--alloc-conf overrides them)"]
    return []


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


def setup_from_options(options: Options):
    from trainmem.setup import SETUP_KEYS, TrainingSetup

    values = {key: value for key, value in options.given.items() if key in SETUP_KEYS}
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

    return TargetOptions(**gpu_options(options), tf_memory=options.tf_memory, tf_onednn=options.tf_onednn)


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
