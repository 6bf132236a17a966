"""argparse → TrainingSetup → estimate() / measure() → render → exit code.

Exit codes: 0 ok / fits, 1 does not fit the device, 2 bad input or a failed trace, 130 interrupted
(Ctrl-C), 141 the reader of stdout went away. Errors are one line on stderr; a traceback only with
--debug. Stdout carries the result alone: whatever the model's code or a library prints while the
model is built and traced goes to stderr (`_user_output_to_stderr`), so `--format json` stays JSON.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import signal
import sys
from collections.abc import Iterator
from typing import Any

from trainmem.cli_parallel import add_parallel_flags
from trainmem.errors import TrainmemError, quote, unknown_key

EXIT_OK, EXIT_DOES_NOT_FIT, EXIT_BAD_INPUT = 0, 1, 2
EXIT_INTERRUPTED = 128 + 2  # SIGINT's number, as a shell reports a process Ctrl-C ended
EXIT_BROKEN_PIPE = 128 + 13  # SIGPIPE's number on Linux and macOS, as a shell reports a process it ended
INTERRUPTED_LINE = b"trainmem: interrupted\n"

# Run options: what the command does with the setup. Their defaults are applied after the flags and
# the --setup file are merged (argparse's own defaults are None, so that "not given" can be told apart
# from "given as the default": a file's device is overridden only by a --device the user typed).
RUN_DEFAULTS: dict[str, Any] = {"device": "cpu", "format": "table", "depth": 2, "runs": 1, "force": False,
                                "max_seq": False, "margin": None, "framework": "auto", "keras_backend": None,
                                "tf_memory": None, "plot": None, "html": None, "memory_snapshot": None,
                                "snapshot_max_entries": None, "quiet": False, "tf_onednn": None}
_NOT_OPTIONS = {"command", "model", "setup", "debug"}
# measure --runs starts one fresh process per run (seconds each, the model's memory each): the median
# of peak RSS settles within a few runs (benchmarks run 3); 20 is room for a careful user, while a
# million would measure for days.
MAX_RUNS = 20


def _version() -> str:
    from trainmem._version import __version__

    return __version__


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse's usage dump becomes our one line
        raise TrainmemError(f"{message} (see {self.prog} --help)", where="command line")


def _setup_default(name: str, words: str | None = None) -> str:
    """' (default: X)' with X read from TrainingSetup, so --help shows the value a run uses."""
    from trainmem.setup import TrainingSetup

    field = next(f for f in dataclasses.fields(TrainingSetup) if f.name == name)
    value = field.default
    if words is not None:
        shown = words
    elif isinstance(value, bool):
        shown = "on" if value else "off"
    else:
        shown = str(value)
    return f" (default: {shown})"


def _run_default(name: str) -> str:
    return f" (default: {RUN_DEFAULTS[name]})"


def _choices(enum_name: str) -> str:
    import trainmem.setup as setup

    return "|".join(member.value for member in getattr(setup, enum_name))


def _references_help() -> str:
    from trainmem.setup import Optimizer

    return (
        "MODEL references:\n"
        "  mlp:1000-100-10                  Linear layers of those widths (the first is the input size)\n"
        "  net.yaml | net.json              a layer spec: input shape and a list of torch.nn layers\n"
        "  path/to/file.py:factory          a function in a Python file you name, returning an nn.Module\n"
        "  package.module:factory           the same, from an importable module\n"
        "  torchvision:NAME | timm:NAME     a vision model by name (timm:NAME?k=v&… for its arguments)\n"
        "  hf:NAME | hf:owner/name[@rev]    a Hugging Face model from its config.json (bundled or from the hub;\n"
        "  hf:DIR | hf:config.json          no weights)\n"
        "  model.onnx                       an ONNX graph, converted to torch\n"
        "  model.pt|.pth|.bin|.ckpt|.safetensors  a checkpoint's tensors (never unpickled freely)\n"
        "  model.keras                      a Keras model: its config.json only, rebuilt with safe_mode (no weights)\n"
        "  SAVED_MODEL_DIR                  a TensorFlow SavedModel (saved_model.pb + variables/), through its\n"
        "                                   serving signature, from shapes alone\n"
        "  --framework keras                builds mlp: and specs as Keras models; file.py:factory returning a\n"
        "                                   keras.Model is detected (its file imports keras or tensorflow)\n"
        f"optimizers: {', '.join(member.value for member in Optimizer)}\n"
        "exit codes: 0 fits, 1 does not fit, 2 bad input or a failed trace, 130 interrupted, 141 closed pipe")


def _add_setup_flags(parser: argparse.ArgumentParser) -> None:
    from trainmem.frontends.hf import DEFAULT_SEQ_LEN

    d = _setup_default
    parser.add_argument("model", help="a model reference (see MODEL references below)")
    parser.add_argument("--setup", metavar="FILE.toml", help="options from a TOML file, keys as the flags' names "
                        "with underscores (batch_size = 8, device = \"a100-80gb\"); flags override it")
    parser.add_argument("--batch-size", type=int, metavar="N", help="samples per micro-batch" + d("batch_size"))
    parser.add_argument("--input-shape", action="append", metavar="SHAPE", help="per-sample shape, e.g. 3,224,224; repeat for "
                        "more inputs (default: the model's own, where it names one)")
    parser.add_argument("--input-dtype", action="append", metavar="DTYPE", help="float32|float16|bfloat16|float64|int64|int32|"
                        "uint8|bool; one, or one per input (default: float32)")
    parser.add_argument("--input-max", action="append", type=int, metavar="N", help="integer inputs are < this, e.g. the "
                        "vocabulary size (default: 2)")
    parser.add_argument("--loss", metavar="LOSS", help=_choices("Loss") + d("loss", "the model's own, else cross-entropy"))
    parser.add_argument("--target-shape", metavar="SHAPE", help="per-sample target shape ('scalar' for a class id), made with "
                        "the batch" + d("target_shape", "made from the output in the loss"))
    parser.add_argument("--optimizer", metavar="NAME", help=_choices("Optimizer") + d("optimizer"))
    parser.add_argument("--optimizer-impl", metavar="IMPL", help=_choices("OptimizerImpl") + "; default is what "
                        "torch picks: for-loop on CPU tensors, foreach on CUDA tensors" + d("optimizer_impl"))
    parser.add_argument("--precision", metavar="PRECISION", help=_choices("Precision") + d("precision"))
    parser.add_argument("--grad-accum", type=int, metavar="N", help="micro-batches per optimizer step" + d("grad_accum"))
    parser.add_argument("--checkpointing", action="store_true", default=None,
                        help="activation checkpointing of the model's blocks" + d("checkpointing"))
    parser.add_argument("--zero-grad", metavar="none|zeros", help="none (free gradients between steps, torch >= 2.0) | zeros (keep "
                        "them, set_to_none=False)" + d("zero_grad"))
    parser.add_argument("--freeze", action="append", metavar="PATTERN",
                        help="parameter names to freeze (fnmatch); repeat for more" + d("freeze", "none"))
    parser.add_argument("--activation", metavar="NAME", help=f"{_choices('Activation')} (mlp: models)" + d("activation"))
    parser.add_argument("--dropout", type=float, metavar="P", help="dropout probability between layers (mlp: models)"
                        + d("dropout"))
    parser.add_argument("--task", metavar="TASK", help="hf: models: causal-lm|masked-lm|seq-cls|seq2seq|image-cls|…"
                        + d("task", "the model's"))
    parser.add_argument("--seq-len", type=int, metavar="N", help="hf: models: tokens per sample"
                        + d("seq_len", f"{DEFAULT_SEQ_LEN}, capped by the model's positions"))
    parser.add_argument("--trust-remote-code", action="store_true", default=None,
                        help="hf: models whose config.json names custom code (auto_map): download that "
                             "repository's Python files and run them to build the model (executes code from the "
                             "hub; only for repositories you trust)" + d("trust_remote_code", "refused"))
    parser.add_argument("--lora", metavar="SPEC", help="LoRA through peft: r=16,alpha=32,targets=q_proj,v_proj"
                        "[,dropout=0.05]" + d("lora", "none"))
    parser.add_argument("--qlora", action="store_true", default=None,
                        help="4-bit NF4 base weights + LoRA (r=64,alpha=16,all linear), bf16-mixed, paged 8-bit "
                             "AdamW, checkpointing; GPU devices" + d("qlora"))
    parser.add_argument("--hf-trainer", action="store_true", default=None,
                        help="what transformers.Trainer does by default: AdamW (fused from torch 2.8, as transformers picks), clip at 1.0, fp32 outputs "
                             "under mixed precision" + d("hf_trainer"))
    parser.add_argument("--max-grad-norm", type=float, metavar="NORM", help="clip_grad_norm_ before each step"
                        + d("max_grad_norm", "no clipping"))
    parser.add_argument("--loop", metavar="LOOP", help="inline (names live until the next iteration) | step-fn | trainer | lean"
                        + d("loop"))
    parser.add_argument("--steps", dest="run_steps", type=int, metavar="N",
                        help="the run's length in optimizer steps, for CPU peak RSS (glibc's heap keeps growing "
                             "after the first steps; two are traced, the last repeated) (default: a long run, "
                             "repeated until the heap stops growing, at most 32 steps)")
    parser.add_argument("--trace-steps", dest="steps", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--device", metavar="DEVICE", help="cpu | a GPU from `trainmem devices` | custom:capacity=24GiB,cc=8.9"
                        + _run_default("device"))
    parser.add_argument("--cuda-context", metavar="SIZE", help="GPU devices: CUDA context bytes in nvidia-smi "
                        "(default: the device's)")
    parser.add_argument("--alloc-conf", metavar="SETTINGS", help="GPU devices: PYTORCH_CUDA_ALLOC_CONF of the "
                        "run, e.g. expandable_segments:True (default: none)")
    parser.add_argument("--cuda-version", metavar="X.Y", help="GPU devices: the run's CUDA (default: this "
                        "torch's; CPU builds: 12.8)")
    parser.add_argument("--module-loading", choices=["lazy", "eager"], help="GPU devices: CUDA_MODULE_LOADING of "
                        "the run (default: lazy; eager before CUDA 11.7)")
    parser.add_argument("--cudnn-benchmark", action="store_true", default=None,
                        help="GPU devices: torch.backends.cudnn.benchmark = True in the run (default: off)")
    parser.add_argument("--framework", metavar="auto|torch|keras", help="how MODEL is read: auto takes .keras files, "
                        "SavedModel directories and factories that import keras as Keras, the rest as PyTorch"
                        + _run_default("framework"))
    parser.add_argument("--keras-backend", metavar="tensorflow|torch", help="Keras models: the backend Keras trains "
                        "on (torch: traced by the PyTorch engine) (default: tensorflow, or the backend of a Keras "
                        "already imported)")
    parser.add_argument("--tf-memory", metavar="MODE", help="Keras on TensorFlow, GPU devices: default (TensorFlow "
                        "maps almost all GPU memory at start) | growth (allow_growth) | limit:SIZE (a logical "
                        "device's memory_limit) | fraction:F (per_process_gpu_memory_fraction) (default: default)")
    parser.add_argument("--tf-onednn", metavar="auto|on|off", help="Keras on TensorFlow, CPU: whether the run has "
                        "oneDNN and its MklCPUAllocator (on/off: TF_ENABLE_ONEDNN_OPTS=1/0; auto: as TensorFlow "
                        "decides, from TF_ENABLE_ONEDNN_OPTS here and this CPU's features) (default: auto)")
    parser.add_argument("--format", choices=["table", "json"], help="report format" + _run_default("format"))
    parser.add_argument("--depth", type=int, metavar="N", help="per-module table depth" + _run_default("depth"))
    parser.add_argument("--debug", action="store_true", help="show tracebacks")


def _add_output_flags(parser: argparse.ArgumentParser) -> None:
    """What else an estimate writes besides its report on stdout (report/)."""
    from trainmem.report.memviz_limits import DEFAULT_MAX_ENTRIES

    parser.add_argument("--plot", metavar="FILE.png|svg", help="also draw memory over the training step, stacked by "
                        "category, to FILE (needs matplotlib: pip install 'trainmem[plot]') (default: none)")
    parser.add_argument("--html", metavar="FILE.html", help="also write a self-contained HTML report (interactive "
                        "timeline, per-module tree, breakdown, assumptions; no network needed to view it) (default: none)")
    parser.add_argument("--memory-snapshot", metavar="FILE.pickle", help="GPU devices: also write the simulated "
                        "allocator's history as torch.cuda.memory._dump_snapshot does, for PyTorch's memory_viz (default: none)")
    parser.add_argument("--snapshot-max-entries", type=int, metavar="N", help="keep at most N trace entries in "
                        f"--memory-snapshot, those around the peak (default: {DEFAULT_MAX_ENTRIES:,})")
    parser.add_argument("--quiet", action="store_true", default=None,
                        help="print the one-line answer only, e.g. 'peak 3.1 GiB (fits a100-40gb, 36.9 GiB free)' "
                        "(default: off)")


def build_parser() -> argparse.ArgumentParser:
    formatter = argparse.RawDescriptionHelpFormatter
    references = _references_help()
    parser = _Parser(prog="trainmem", description="How much memory will training take — before you train.",
                     epilog=references, formatter_class=formatter)
    parser.add_argument("--debug", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--version", action="version", version=f"trainmem {_version()}")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    add = lambda name, text: commands.add_parser(name, help=text, description=text, epilog=references,  # noqa: E731
                                                 formatter_class=formatter)
    estimate = add("estimate", "estimate training memory")
    _add_setup_flags(estimate)
    add_parallel_flags(estimate)
    _add_output_flags(estimate)
    measure = add("measure", "run the steps for real and compare with the estimate")
    _add_setup_flags(measure)
    add_parallel_flags(measure)
    measure.add_argument("--force", action="store_true", default=None,
                         help="run even if the estimate says it will not fit (default: off)")
    measure.add_argument("--runs", type=int, metavar="N", help="fresh processes for RSS (median reported)" + _run_default("runs"))
    fit = add("fit", "the largest batch size (or --max-seq: sequence length) that fits --device")
    _add_setup_flags(fit)
    add_parallel_flags(fit)
    fit.add_argument("--max-seq", action="store_true", default=None,
                     help="search the first input's first dimension (hf: --seq-len), batch fixed (default: off)")
    fit.add_argument("--margin", help="fraction of the capacity to keep free, 0 ≤ m < 1 (default: the measured "
                     "worst low error, trainmem/fit.py DEFAULT_MARGIN_GPU / _CPU)")
    from trainmem.sweep_cli import COMPARE_DESCRIPTION, COMPARE_HELP, add_compare_flags

    compare = add("compare", COMPARE_HELP)
    compare.description = COMPARE_DESCRIPTION
    _add_setup_flags(compare)
    add_parallel_flags(compare)
    add_compare_flags(compare)
    from trainmem.plan.command import add_plan_command

    add_plan_command(commands, _add_setup_flags)
    devices = commands.add_parser("devices", help="list target devices")
    devices.add_argument("--format", choices=["table", "json"], default="table", help="(default: table)")
    devices.add_argument("--search", metavar="TEXT", help="only the devices whose name, alias or product name "
                         "contains TEXT, ignoring case, spaces and dashes (e.g. 3060, 'a100 80gb', mi300x); "
                         "none: one line, exit 2")
    calibrate = commands.add_parser("calibrate", help="measure this machine's CPU process floor once, for every "
                                    "later estimate here (about a minute)")
    calibrate.add_argument("--runs", type=int, default=3, metavar="N",
                           help="fresh processes for the floor; N-1 for each kernel family, N-2 (at least 1) for each library set "
                                "(default: 3)")
    calibrate.add_argument("--no-libraries", action="store_true",
                           help="skip the increments of transformers and peft (default: measured when installed)")
    calibrate.add_argument("--format", choices=["text", "json"], default="text", help="(default: text)")
    return parser


# ---- options: flags over the --setup file over the defaults ---------------------------------------------


@dataclasses.dataclass(frozen=True)
class Options:
    """Every option of one command, merged; `given` holds only what the user gave, `origins` where."""

    values: dict[str, Any]
    given: dict[str, Any]
    origins: dict[str, str]

    def __getattr__(self, name: str) -> Any:
        try:
            return self.values[name]
        except KeyError:
            raise AttributeError(name) from None


def _option_keys(parser: argparse.ArgumentParser) -> set[str]:
    """The keys a --setup file may hold: every command's flags (a file may be shared between commands)."""
    keys: set[str] = set()
    for action in parser._subparsers._group_actions[0].choices.values():  # noqa: SLF001 - argparse's own table
        keys |= {a.dest for a in action._actions if a.dest not in _NOT_OPTIONS and a.dest != "help"}  # noqa: SLF001
    return keys


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
    flags = explicit({key: value for key, value in vars(args).items() if key not in _NOT_OPTIONS})
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
    _check_framework_options(options, where)
    _check_output_options(options)
    device = options.device
    try:
        gpu = None if device.strip().lower() in ("cpu", "cuda") else get_device(device).gpu
    except TrainmemError as error:
        raise TrainmemError(getattr(error, "message", str(error)), where=where("device")) from None
    run = Invocation(command, options.model, reference_kind(options.model), device, gpu, options.given, options.origins)
    return check(run)


def _check_framework_options(options: Options, where) -> None:
    """--framework, --keras-backend and --tf-memory values, from flags or a --setup file; which runs they
    apply to is flag_rules.py's table."""
    from trainmem.frontends.keras_import import KERAS_BACKENDS
    from trainmem.frontends.keras_ref import FRAMEWORKS

    for key, choices in (("framework", FRAMEWORKS), ("keras_backend", KERAS_BACKENDS)):
        value = options.values[key]
        if value is not None and value not in choices:
            raise TrainmemError(f"expected {'|'.join(choices)}, got {quote(value)}", where=where(key))
    if options.tf_onednn is not None and options.tf_onednn not in ("auto", "on", "off"):
        raise TrainmemError(f"expected auto|on|off, got {quote(options.tf_onednn)}", where=where("tf_onednn"))
    if options.tf_memory is not None:
        from trainmem.targets.tf_gpu import parse_mode

        if not isinstance(options.tf_memory, str):
            raise TrainmemError(f"expected text, got {quote(options.tf_memory)}", where=where("tf_memory"))
        try:
            parse_mode(options.tf_memory)
        except TrainmemError as error:
            raise TrainmemError(error.message, where=where("tf_memory")) from None


def gpu_options(options: Options) -> dict[str, Any]:
    from trainmem.flag_rules import CUDA_KEYS
    from trainmem.units import parse_bytes

    chosen = {key: options.given[key] for key in CUDA_KEYS if key in options.given}
    if "cuda_context" in chosen:
        chosen["cuda_context"] = parse_bytes(str(chosen["cuda_context"]), options.origins["cuda_context"])
    return chosen


# ---- the commands: each computes its output; main() prints it ------------------------------------------


@dataclasses.dataclass(frozen=True)
class Outcome:
    text: str
    code: int
    warnings: tuple[str, ...] = ()


def _estimate(options: Options, setup: Any) -> Outcome:
    from trainmem.estimate import estimate

    result = estimate(options.model, setup=setup, device=options.device, depth=options.depth,
                      compare_loop=True, **_framework_options(options), **gpu_options(options))
    written = _write_outputs(result, options)
    if options.quiet:
        from trainmem.report.text import render_quiet

        text = render_quiet(result)
    elif options.format == "json":
        text = json.dumps(result.to_dict(), indent=2)
    elif options.values.get("colour"):
        from trainmem.report.text import render_text

        text = render_text(result, colour=True)
    else:
        text = str(result)
    return Outcome(text, EXIT_OK if result.fits else EXIT_DOES_NOT_FIT,
                   _trace_warnings(result.warnings, options.format) + written)


def _write_outputs(result: Any, options: Options) -> tuple[str, ...]:
    """--plot, --html and --memory-snapshot: each file written, one stderr line each (what was cut, if anything)."""
    lines = []
    if options.plot:
        from trainmem.report.plot import write_timeline_plot

        write_timeline_plot(result, options.plot)
        lines.append(f"trainmem: wrote the timeline plot to {options.plot}")
    if options.html:
        from trainmem.report.html import write_html

        write_html(result, options.html)
        lines.append(f"trainmem: wrote the HTML report to {options.html}")
    if options.memory_snapshot:
        from trainmem.report.memviz import write_snapshot
        from trainmem.report.memviz_limits import DEFAULT_MAX_ENTRIES

        limit = options.snapshot_max_entries or DEFAULT_MAX_ENTRIES
        note = write_snapshot(result, options.memory_snapshot, limit)
        lines.append(f"trainmem: wrote the memory snapshot to {options.memory_snapshot}" + (f" ({note})" if note else ""))
    return tuple(lines)


def _check_output_options(options: Options) -> None:
    """The output files' names and the snapshot's cap, checked before anything is traced."""
    from trainmem.flag_rules import flag_of

    where = lambda key: options.origins.get(key, flag_of(key))  # noqa: E731
    for key, suffixes in (("plot", (".png", ".svg")), ("html", (".html", ".htm")), ("memory_snapshot", None)):
        path = options.values[key]
        if path is None:
            continue
        if not isinstance(path, str) or not path.strip():
            raise TrainmemError(f"expected a file name, got {quote(path)}", where=where(key))
        if suffixes and not path.lower().endswith(suffixes):
            raise TrainmemError(f"expected a file name ending in {' or '.join(suffixes)}, got {quote(path)}",
                                where=where(key))
        folder = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(folder):
            raise TrainmemError(f"expected a file in an existing folder, got {quote(path)} ({folder} does not "
                                "exist)", where=where(key))
        if os.path.isdir(path):
            raise TrainmemError(f"expected a file name, got the folder {quote(path)}", where=where(key))
    limit = options.snapshot_max_entries
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise TrainmemError(f"expected a whole number of at least 1, got {quote(limit)}",
                            where=where("snapshot_max_entries"))
    if options.quiet and options.given.get("format") == "json":
        raise TrainmemError("expected --quiet or --format json, got both", where=where("quiet"))


def _fit(options: Options, setup: Any) -> Outcome:
    from trainmem.fit import fit
    from trainmem.frontends.keras_ref import is_keras_reference

    if is_keras_reference(options.model, options.framework):
        raise TrainmemError("expected a PyTorch model for fit (it searches PyTorch models; estimate a Keras model at "
                            f"the batch sizes you consider), got a Keras model {quote(options.model)}", where="MODEL")

    result = fit(options.model, setup, options.device, sequence=bool(options.max_seq), margin=options.margin,
                 **gpu_options(options))
    text = json.dumps(result.to_dict(), indent=2) if options.format == "json" else str(result)
    return Outcome(text, EXIT_OK if result.best is not None else EXIT_DOES_NOT_FIT)


def _framework_options(options: Options) -> dict[str, Any]:
    return {"framework": options.framework, "keras_backend": options.keras_backend, "tf_memory": options.tf_memory,
            "tf_onednn": options.tf_onednn}


def _compare(options: Options, setup: Any) -> Outcome:
    """Configurations (a second MODEL or --sweep: sweep_cli.py), else one model in PyTorch and in Keras."""
    from trainmem.compare import compare
    from trainmem.sweep_cli import compares_configurations, refuse_configuration_flags, run_compare

    if compares_configurations(options):
        return run_compare(options)
    refuse_configuration_flags(options)
    result = compare(options.model, setup, options.device, tf_memory=options.tf_memory)
    return Outcome(json.dumps(result.to_dict(), indent=2) if options.format == "json" else str(result), EXIT_OK)


def _measure(options: Options, setup: Any) -> Outcome:
    from trainmem.measure.cpu import measure
    from trainmem.frontends.keras_ref import is_keras_reference

    if setup.parallel.distributed:
        from trainmem.cli_parallel import measure_distributed_outcome

        text = measure_distributed_outcome(options, setup)
        return Outcome(text, EXIT_OK)
    if options.keras_backend != "torch" and (is_keras_reference(options.model, options.framework)
                                             or _keras_factory_file(options)):
        from trainmem.estimate.keras_measured import measure_keras_beside_estimate

        if options.device != "cpu":
            raise TrainmemError("expected --device cpu with a Keras model (the measured fit runs on this machine; "
                                f"a GPU it finds is reported beside), got {quote(options.device)}",
                                where=options.origins.get("device", "--device"))
        result = measure_keras_beside_estimate(options.model, setup, runs=options.runs, force=bool(options.force))
        return Outcome(json.dumps(result.to_dict(), indent=2) if options.format == "json" else str(result), EXIT_OK)

    if options.device != "cpu":  # one JSON line: measured on this machine's GPU, estimated for it
        from trainmem.measure.cuda import measure_on_gpu

        return Outcome(json.dumps(measure_on_gpu(options.model, setup, options.device, **gpu_options(options))),
                       EXIT_OK)
    comparison = measure(options.model, setup, force=bool(options.force), runs=options.runs, depth=options.depth,
                         framework=options.framework, keras_backend=options.keras_backend)
    return Outcome(json.dumps(comparison.to_dict(), indent=2) if options.format == "json" else str(comparison), EXIT_OK)


def _keras_factory_file(options: Options) -> bool:
    """Under --framework auto, whether a file.py:factory to measure is Keras's, read from its text (its import
    lines: keras or tensorflow and not torch), not run: the measured child runs it, and a torch file would
    otherwise run here twice (frontends/keras_ref.py decides the same way from a loaded module's names)."""
    import re

    from trainmem.frontends import Kind, reference_kind

    if options.framework != "auto" or reference_kind(options.model) != Kind.PYTHON:
        return False
    path = options.model.strip().rpartition(":")[0]
    if not path.endswith(".py"):
        return False
    try:
        with open(path, "rb") as handle:
            text = handle.read(1 << 20).decode("utf-8", "replace")
    except OSError:
        return False  # the torch path's resolver says what is wrong with the file
    imported = set(re.findall(r"^\s*(?:import|from)\s+(keras|tensorflow|tf_keras|torch)\b", text, re.MULTILINE))
    return bool(imported - {"torch"}) and "torch" not in imported


def _devices(args: argparse.Namespace) -> Outcome:
    from trainmem.devices import all_devices, format_table, search_devices

    devices = all_devices() if args.search is None else search_devices(args.search)
    return Outcome(json.dumps([d.listing() for d in devices], indent=2) if args.format == "json"
                   else format_table(devices), EXIT_OK)


def _calibrate(args: argparse.Namespace) -> Outcome:
    from trainmem.calibrate import calibrate

    if not 1 <= args.runs <= MAX_RUNS:
        raise TrainmemError(f"expected --runs between 1 and {MAX_RUNS}, got {args.runs}", where="--runs")
    say = (lambda line: None) if args.format == "json" else (lambda line: print(line, file=sys.stderr, flush=True))
    done = calibrate(args.runs, libraries=not args.no_libraries, say=say)
    if args.format == "json":
        return Outcome(json.dumps({**done.entry, "stored": str(done.path), "seconds": round(done.seconds, 1)},
                                  indent=2), EXIT_OK)
    entry = done.entry
    return Outcome(f"calibrated {entry['cpu']} ({entry['capability']}, {entry['threads']} threads, torch "
                   f"{entry['torch']}) in {done.seconds:.0f} s: process floor {entry['floor_bytes'] / 2**20:.1f} MiB; "
                   f"stored in {done.path}; estimates on this machine now use it", EXIT_OK)


def _trace_warnings(warnings: list[str], fmt: str) -> tuple[str, ...]:
    """Assumptions the trace made about the model's ops (data-dependent values) also go to stderr;
    the rest are in the report. JSON output keeps stderr quiet for scripts: all are in the JSON."""
    if fmt == "json":
        return ()
    return tuple(f"warning: {warning}" for warning in warnings if warning.startswith("aten."))


def _plan(options: Options, setup: Any) -> Outcome:
    from trainmem.plan.command import run_plan

    return run_plan(options, setup)


_COMMANDS = {"estimate": _estimate, "measure": _measure, "fit": _fit, "compare": _compare, "plan": _plan}


def run_command(args: argparse.Namespace, parser: argparse.ArgumentParser) -> Outcome:
    if args.command == "devices":
        return _devices(args)
    if args.command == "calibrate":
        return _calibrate(args)
    options = merge_options(args, _option_keys(parser))
    options.values["model"] = args.model
    warnings = check_run_options(options, args.command)
    setup = setup_from_options(options)
    options.values["colour"] = _stdout_wants_colour()  # read before stdout is pointed at stderr below
    with _user_output_to_stderr():
        try:
            outcome = _COMMANDS[args.command](options, setup)
        except SystemExit as stop:  # the model's code (a forward, a library it imports) called sys.exit
            raise TrainmemError(f"expected the model's code to return, it called sys.exit({quote(stop.code)})",
                                where=args.model) from None
        except (ImportError, TrainmemError) as error:  # torch not installed: which extra to install
            from trainmem.install_hints import missing_framework_line

            line = missing_framework_line(error, args.model, options.framework,
                                          keras_command=args.command not in ("fit", "compare"))
            if line is None:
                raise
            raise TrainmemError(line) from error
    return dataclasses.replace(outcome, warnings=tuple(warnings) + outcome.warnings)


def _stdout_wants_colour() -> bool:
    """Colour on a terminal only, never with NO_COLOR set (report/style.py)."""
    from trainmem.report.style import use_colour

    return use_colour(sys.stdout)


# ---- the process: stdout, Ctrl-C, errors -----------------------------------------------------------------


@contextlib.contextmanager
def _user_output_to_stderr() -> Iterator[None]:
    """While the model is built and traced, stdout belongs to the user's code and the libraries it
    imports (a factory's print, transformers' notices): send it to stderr, so that stdout carries the
    result alone and `--format json | jq` works. Python-level writes follow sys.stdout; writes to file
    descriptor 1 from C extensions follow the descriptor, so fd 1 is pointed at fd 2 for the duration
    and restored before the result is printed. Where stdout has no descriptor (an in-process capture),
    only the Python level is redirected."""
    try:
        sys.stdout.flush()
        stdout_fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):
        stdout_fd = None
    saved = None
    if stdout_fd is not None:
        sys.stderr.flush()
        saved = os.dup(stdout_fd)
        os.dup2(sys.stderr.fileno(), stdout_fd)
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        sys.stderr.flush()
        if saved is not None:
            os.dup2(saved, stdout_fd)
            os.close(saved)


def _interrupted(signum: int, frame: Any) -> None:
    """Ctrl-C: end now, from wherever the main thread is. A KeyboardInterrupt could be caught (or
    delayed) by the model's code or a library between here and main(); the handler runs between two
    bytecodes of the main thread, which a fake-tensor trace (Python through and through) reaches
    constantly, and os._exit skips every cleanup that could block (atexit, thread joins)."""
    try:
        sys.stderr.flush()
    except Exception:  # noqa: BLE001 - a flush interrupted mid-write must not stop the exit
        pass
    os.write(2, INTERRUPTED_LINE)
    os._exit(EXIT_INTERRUPTED)


@contextlib.contextmanager
def _ctrl_c_ends_the_process() -> Iterator[None]:
    try:
        previous = signal.signal(signal.SIGINT, _interrupted)
    except ValueError:  # not the main thread (main() called from a thread): Python's default stays
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


_running = False  # main() is running in this process: a model factory that calls it again would recurse


def main(argv: list[str] | None = None) -> int:
    global _running
    if _running:  # e.g. `trainmem estimate trainmem.cli:main`: trainmem itself given as the model's factory
        raise TrainmemError("expected a model factory, got trainmem's own command line (trainmem.cli.main)",
                            where="MODEL")
    _running = True
    try:
        return _main(argv)
    finally:
        _running = False


def _main(argv: list[str] | None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    debug = "--debug" in argv
    with _ctrl_c_ends_the_process():
        try:
            parser = build_parser()
            args = parser.parse_args(argv)
            outcome = run_command(args, parser)
            for line in outcome.warnings:
                print(line, file=sys.stderr)
            print(outcome.text)
            sys.stdout.flush()  # a closed pipe shows here, inside the try, not at the interpreter's exit
            return outcome.code
        except TrainmemError as error:
            if debug:
                raise
            print(f"trainmem: error: {error}", file=sys.stderr)
            return EXIT_BAD_INPUT
        except KeyboardInterrupt:  # Ctrl-C where the handler could not be installed
            print(INTERRUPTED_LINE.decode().strip(), file=sys.stderr)
            return EXIT_INTERRUPTED
        except BrokenPipeError:
            # the reader went away (`trainmem … | head -2`): not a verdict on the model, so never exit 1
            # ("does not fit"); point stdout at /dev/null so the interpreter's final flush stays quiet, and
            # exit as a process that SIGPIPE ended does in a shell (128 + 13)
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return EXIT_BROKEN_PIPE
        except Exception as error:  # noqa: BLE001 - anything unexpected is still one line without --debug
            if debug:
                raise
            print(f"trainmem: error: {type(error).__name__}: {one_line_of(error)} (rerun with --debug for the "
                  "traceback)", file=sys.stderr)
            return EXIT_BAD_INPUT


def one_line_of(error: BaseException) -> str:
    from trainmem.errors import one_line

    return one_line(error)
