"""argparse → TrainingSetup → estimate() / measure() → render → exit code.

Exit codes: 0 ok / fits, 1 does not fit the device, 2 bad input or a failed trace. Errors are one
line on stderr; a traceback only with --debug.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from trainmem.errors import TrainmemError

EXIT_OK, EXIT_DOES_NOT_FIT, EXIT_BAD_INPUT = 0, 1, 2
EXIT_BROKEN_PIPE = 128 + 13  # SIGPIPE's number on Linux and macOS, as a shell reports a process it ended


def _version() -> str:
    from trainmem import __version__

    return __version__


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse's usage dump becomes our one line
        raise TrainmemError(f"{message} (see {self.prog} --help)", where="command line")


def _add_setup_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help="mlp:1000-100-10 | spec.yaml | file.py:factory | package.module:factory")
    parser.add_argument("--setup", metavar="FILE.toml", help="training setup from a TOML file (flags override it)")
    parser.add_argument("--batch-size", type=int)
    parser.add_argument("--input-shape", action="append", help="per-sample shape, e.g. 3,224,224; repeat for more inputs")
    parser.add_argument("--input-dtype", action="append", help="float32|int64|…; one, or one per input")
    parser.add_argument("--input-max", action="append", type=int, help="token ids are < this (int inputs)")
    parser.add_argument("--loss", help="cross-entropy|mse|sum")
    parser.add_argument("--target-shape", help="per-sample target shape ('scalar' for a class id), made with the batch (default: from the output)")
    parser.add_argument("--optimizer", help="sgd|momentum|adam|adamw|rmsprop|adagrad")
    parser.add_argument("--optimizer-impl", help="foreach|for-loop|fused (default: what torch picks)")
    parser.add_argument("--precision", help="fp32|fp16-mixed|bf16-mixed|bf16")
    parser.add_argument("--grad-accum", type=int)
    parser.add_argument("--checkpointing", action="store_true", default=None)
    parser.add_argument("--zero-grad", help="none (free gradients between steps, torch >= 2.0) | zeros (keep them, set_to_none=False)")
    parser.add_argument("--freeze", action="append", metavar="PATTERN", help="parameter names to freeze (fnmatch)")
    parser.add_argument("--activation", help="relu|tanh|gelu|sigmoid (mlp: models)")
    parser.add_argument("--dropout", type=float, help="dropout probability between layers (mlp: models)")
    parser.add_argument("--task", help="hf: models: causal-lm|masked-lm|seq-cls|seq2seq|image-cls|… (default: the model's)")
    parser.add_argument("--seq-len", type=int, help="hf: models: tokens per sample (default 512, capped by the model)")
    parser.add_argument("--lora", metavar="SPEC", help="LoRA through peft: r=16,alpha=32,targets=q_proj,v_proj[,dropout=0.05]")
    parser.add_argument("--qlora", action="store_true", default=None,
                        help="4-bit NF4 base weights + LoRA (default r=64,alpha=16,all linear), bf16, paged 8-bit AdamW")
    parser.add_argument("--hf-trainer", action="store_true", default=None,
                        help="what transformers.Trainer does by default: fused AdamW, clip at 1.0, fp32 outputs under mixed precision")
    parser.add_argument("--max-grad-norm", type=float, help="clip_grad_norm_ before each step")
    parser.add_argument("--loop", help="inline (default: names live until the next iteration) | step-fn | trainer | lean")
    parser.add_argument("--steps", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--device", default="cpu", help="cpu | a GPU from `trainmem devices` | custom:capacity=24GiB,cc=8.9")
    parser.add_argument("--cuda-context", metavar="SIZE", help="CUDA context bytes in nvidia-smi (default: the device's)")
    parser.add_argument("--alloc-conf", metavar="SETTINGS", help="PYTORCH_CUDA_ALLOC_CONF for the run, e.g. expandable_segments:True")
    parser.add_argument("--cuda-version", metavar="X.Y", help="the target run's CUDA (default: this torch's; CPU builds: 12.8)")
    parser.add_argument("--module-loading", choices=["lazy", "eager"], help="CUDA_MODULE_LOADING of the run (default lazy; eager before CUDA 11.7)")
    parser.add_argument("--cudnn-benchmark", action="store_true", default=None, help="torch.backends.cudnn.benchmark = True in the run")
    parser.add_argument("--format", choices=["table", "json"], default="table")
    parser.add_argument("--depth", type=int, default=2, help="per-module table depth")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="trainmem", description="How much memory will training take — before you train.")
    parser.add_argument("--debug", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--version", action="version", version=f"trainmem {_version()}")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    _add_setup_flags(commands.add_parser("estimate", help="estimate training memory"))
    measure = commands.add_parser("measure", help="run the steps for real and compare with the estimate")
    _add_setup_flags(measure)
    measure.add_argument("--force", action="store_true", help="run even if the estimate says it will not fit")
    measure.add_argument("--runs", type=int, default=1, help="fresh processes for RSS (median reported)")
    fit = commands.add_parser("fit", help="the largest batch size (or --max-seq: sequence length) that fits --device")
    _add_setup_flags(fit)
    fit.add_argument("--max-seq", action="store_true", help="search the first input's first dimension, batch fixed")
    fit.add_argument("--margin", help="fraction of the capacity to keep free, 0 ≤ m < 1 (default: the measured "
                     "worst low error, trainmem/fit.py DEFAULT_MARGIN_GPU / _CPU)")
    commands.add_parser("devices", help="list target devices").add_argument("--format", choices=["table", "json"], default="table")
    return parser


_FLAG_TO_KEY = {"batch_size": "batch_size", "loss": "loss", "target_shape": "target_shape", "optimizer": "optimizer", "optimizer_impl": "optimizer_impl",
                "precision": "precision", "grad_accum": "grad_accum", "checkpointing": "checkpointing",
                "freeze": "freeze", "zero_grad": "zero_grad", "activation": "activation", "dropout": "dropout", "steps": "steps", "task": "task", "seq_len": "seq_len", "lora": "lora", "qlora": "qlora", "hf_trainer": "hf_trainer", "max_grad_norm": "max_grad_norm",
                "loop": "loop"}


def setup_from_args(args: argparse.Namespace):
    from trainmem.setup import TrainingSetup, parse_inputs

    values: dict[str, Any] = {}
    if args.setup:
        values = TrainingSetup.from_toml(args.setup).to_dict()
        values["inputs"] = parse_inputs([s["shape"] for s in values["inputs"]], [s["dtype"] for s in values["inputs"]],
                                        [s["max_value"] for s in values["inputs"]]) if values["inputs"] else ()
    for flag, key in _FLAG_TO_KEY.items():
        if getattr(args, flag) is not None:
            values[key] = getattr(args, flag)
    if args.input_shape:
        values["inputs"] = parse_inputs(args.input_shape, args.input_dtype, args.input_max)
    elif args.input_dtype or args.input_max:
        raise TrainmemError("expected --input-shape with --input-dtype/--input-max, got none", where="command line")
    return TrainingSetup.from_mapping(values, where="command line")


def _estimate(args: argparse.Namespace) -> int:
    from trainmem.estimate import estimate

    if args.depth < 1:
        raise TrainmemError(f"expected --depth of at least 1, got {args.depth}", where="--depth")
    result = estimate(args.model, setup=setup_from_args(args), device=args.device, depth=args.depth,
                      compare_loop=True, **_gpu_options(args))
    _print_warnings(result.warnings, args.format)
    print(json.dumps(result.to_dict(), indent=2) if args.format == "json" else str(result))
    return EXIT_OK if result.fits else EXIT_DOES_NOT_FIT


def _gpu_options(args: argparse.Namespace) -> dict[str, Any]:
    from trainmem.units import parse_bytes

    options: dict[str, Any] = {}
    if args.cuda_context is not None:
        options["cuda_context"] = parse_bytes(args.cuda_context, "--cuda-context")
    if args.alloc_conf is not None:
        options["alloc_conf"] = args.alloc_conf
    for name in ("cuda_version", "module_loading", "cudnn_benchmark"):
        if getattr(args, name) is not None:
            options[name] = getattr(args, name)
    return options


def _fit(args: argparse.Namespace) -> int:
    from trainmem.fit import fit

    result = fit(args.model, setup_from_args(args), args.device, sequence=args.max_seq, margin=args.margin,
                 **_gpu_options(args))
    print(json.dumps(result.to_dict(), indent=2) if args.format == "json" else str(result))
    return EXIT_OK if result.best is not None else EXIT_DOES_NOT_FIT


def _measure(args: argparse.Namespace) -> int:
    from trainmem.measure.cpu import measure

    if args.device != "cpu":  # one JSON line: measured on this machine's GPU, estimated for it
        from trainmem.measure.cuda import measure_on_gpu

        print(json.dumps(measure_on_gpu(args.model, setup_from_args(args), args.device, **_gpu_options(args))))
        return EXIT_OK

    comparison = measure(args.model, setup_from_args(args), force=args.force, runs=args.runs, depth=args.depth)
    print(json.dumps(comparison.to_dict(), indent=2) if args.format == "json" else str(comparison))
    return EXIT_OK


def _devices(args: argparse.Namespace) -> int:
    from trainmem.devices import all_devices, format_table

    devices = all_devices()
    print(json.dumps([d.to_dict() for d in devices], indent=2) if args.format == "json" else format_table(devices))
    return EXIT_OK


def _print_warnings(warnings: list[str], fmt: str) -> None:
    """Assumptions the trace made about the model's ops (data-dependent values) also go to stderr;
    the rest are in the report. JSON output keeps stderr quiet for scripts: all are in the JSON."""
    if fmt == "json":
        return
    for warning in warnings:
        if warning.startswith("aten."):
            print(f"warning: {warning}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    debug = "--debug" in argv
    try:
        args = build_parser().parse_args(argv)
        return {"estimate": _estimate, "measure": _measure, "fit": _fit, "devices": _devices}[args.command](args)
    except TrainmemError as error:
        if debug:
            raise
        print(f"trainmem: error: {error}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # the reader went away (`trainmem … | head -2`): not a verdict on the model, so never exit 1
        # ("does not fit"); point stdout at /dev/null so the interpreter's final flush stays quiet, and
        # exit as a process that SIGPIPE ended does in a shell (128 + 13)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    except Exception as error:  # noqa: BLE001 - anything unexpected is still one line without --debug
        if debug:
            raise
        print(f"trainmem: error: {type(error).__name__}: {error} (rerun with --debug for the traceback)", file=sys.stderr)
        return EXIT_BAD_INPUT
