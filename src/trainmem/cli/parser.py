"""The argument parser: the setup flags every model command shares, the output flags of estimate, and each
command's own flags (cli/commands/, one module a command, each adding its subparser)."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import Any

from trainmem.cli.options import RUN_DEFAULTS
from trainmem.cli.outcome import EXIT_STATUS_HELP
from trainmem.errors import TrainmemError
from trainmem.setup.count_limits import MAX_RUN_STEPS
from trainmem.setup.text_values import MODULE_LOADING, reader


def _version() -> str:
    from trainmem._version import __version__

    return __version__


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse's usage dump becomes our one line
        raise TrainmemError(f"{message} (see {self.prog} --help)", where="command line")

    def _print_message(self, message: str, file: Any = None) -> None:  # --help on a stream that is not UTF-8
        from trainmem.cli.encoding import for_stream

        super()._print_message(for_stream(message, file or sys.stderr) if message else message, file)


def setup_default(name: str, words: str | None = None) -> str:
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


def run_default(name: str) -> str:
    return f" (default: {RUN_DEFAULTS[name]})"


def choices_of(enum_name: str) -> str:
    import trainmem.setup as setup

    return "|".join(member.value for member in getattr(setup, enum_name))


def references_help() -> str:
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
        + EXIT_STATUS_HELP)


TORCH_VERSION_HELP = ("the torch the run used, for its defaults where they decide memory: before 2.0 zero_grad keeps "
                      "the gradients and optimizers step per tensor; the Trainer's AdamW is fused from 2.8")
SEQ_LENGTHS_HELP = ("pack_padded_sequence: the dataset's sequence lengths (or a sample); the worst batch packs "
                    "its B longest, each at most the padded length")
TRUST_REMOTE_CODE_HELP = ("hf: models whose config.json names custom code (auto_map): download that repository's "
                          "Python files and run them to build the model (executes code from the hub; only for "
                          "repositories you trust)")


def add_setup_flags(parser: argparse.ArgumentParser) -> None:
    from trainmem.frontends.hf import DEFAULT_SEQ_LEN

    d = setup_default
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
    parser.add_argument("--loss", metavar="LOSS", help=choices_of("Loss") + d("loss", "the model's own, else cross-entropy"))
    parser.add_argument("--target-shape", metavar="SHAPE", help="per-sample target shape ('scalar' for a class id), made with "
                        "the batch" + d("target_shape", "made from the output in the loss"))
    parser.add_argument("--optimizer", metavar="NAME", help=choices_of("Optimizer") + d("optimizer"))
    parser.add_argument("--optimizer-impl", metavar="IMPL", help=choices_of("OptimizerImpl") + "; default is what "
                        "torch picks: for-loop on CPU tensors, foreach on CUDA tensors" + d("optimizer_impl"))
    parser.add_argument("--precision", metavar="PRECISION", help=choices_of("Precision") + d("precision"))
    parser.add_argument("--grad-accum", type=int, metavar="N", help="micro-batches per optimizer step" + d("grad_accum"))
    parser.add_argument("--checkpointing", action=argparse.BooleanOptionalAction, default=None, help="activation "
                        "checkpointing of the model's blocks; --no-checkpointing undoes --qlora's" + d("checkpointing"))
    parser.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None, help="model = "
                        "torch.compile(model): the forward as Inductor compiles it (CPU target)" + d("compile"))
    parser.add_argument("--zero-grad", metavar="none|zeros", help="none (free gradients between steps, torch >= 2.0) | zeros (keep "
                        "them, set_to_none=False)" + d("zero_grad"))
    parser.add_argument("--freeze", action="append", metavar="PATTERN",
                        help="parameter names to freeze (fnmatch); repeat for more" + d("freeze", "none"))
    parser.add_argument("--activation", metavar="NAME", help=f"{choices_of('Activation')} (mlp: models)" + d("activation"))
    parser.add_argument("--dropout", type=float, metavar="P", help="dropout probability between layers (mlp: models)"
                        + d("dropout"))
    parser.add_argument("--task", metavar="TASK", help="hf: models: causal-lm|masked-lm|seq-cls|seq2seq|image-cls|…"
                        + d("task", "the model's"))
    parser.add_argument("--seq-len", type=int, metavar="N", help="hf: models: tokens per sample"
                        + d("seq_len", f"{DEFAULT_SEQ_LEN}, capped by the model's positions"))
    parser.add_argument("--trust-remote-code", action="store_true", default=None, help=TRUST_REMOTE_CODE_HELP + d(
                        "trust_remote_code", "refused"))
    parser.add_argument("--lora", metavar="SPEC", help="LoRA through peft: r=16,alpha=32,targets=q_proj,v_proj"
                        "[,dropout=0.05]; `own`: the model has its own adapters (LitGPT's lora.GPT), --qlora adds "
                        "none" + d("lora", "none"))
    parser.add_argument("--qlora", action=argparse.BooleanOptionalAction, default=None,
                        help="4-bit NF4 base weights + LoRA (r=64,alpha=16,all linear), bf16-mixed, paged 8-bit "
                             "AdamW, checkpointing (--no-checkpointing: none); GPU devices" + d("qlora"))
    parser.add_argument("--trainer", metavar="NAME", help="whose code runs the step: plain (your loop) | lightning "
                        "(Trainer) | fabric | accelerate | hf (transformers' Trainer: --hf-trainer); its loop and how it "
                        "wraps the forward (Fabric and Accelerate: an fp32 copy of low-precision outputs)" + d("trainer", "plain"))
    parser.add_argument("--hf-trainer", action=argparse.BooleanOptionalAction, default=None,
                        help="what transformers.Trainer does by default: AdamW (fused from torch 2.8, as transformers picks), clip at 1.0 (--max-grad-norm "
                             "none: no clipping), fp32 outputs under mixed precision" + d("hf_trainer"))
    parser.add_argument("--max-grad-norm", type=reader("max_grad_norm"), metavar="NORM|none", help="clip_grad_norm_ before each "
                        "step; none: no clipping, also with --hf-trainer (its 1.0)" + d("max_grad_norm", "no clipping"))
    parser.add_argument("--torch-version", metavar="X.Y", help=TORCH_VERSION_HELP + d("torch_version", "installed"))
    add_qlora_detail_flags(parser)
    add_load_flags(parser)
    parser.add_argument("--seq-lengths", metavar="N,N,…", help=SEQ_LENGTHS_HELP + d("seq_lengths", "the padded length"))
    parser.add_argument("--loop", metavar="LOOP", help="inline (names live until the next iteration) | step-fn | trainer | lean | lightning | lightning-iterable"
                        + d("loop"))
    parser.add_argument("--steps", dest="run_steps", type=int, metavar="N",
                        help=f"the run's length in optimizer steps, 1 to {MAX_RUN_STEPS:,}, for CPU peak RSS (glibc's heap keeps "
                             "growing after the first steps; two are traced, the last repeated; measure runs N real "
                             "steps) (default: a long run, 32 steps, fewer only where the replay would be too long)")
    parser.add_argument("--trace-steps", dest="steps", type=int, help=argparse.SUPPRESS)
    add_target_flags(parser)
    parser.add_argument("--format", choices=["table", "json"], help="report format" + run_default("format"))
    parser.add_argument("--depth", type=int, metavar="N", help="per-module table depth" + run_default("depth"))
    parser.add_argument("--debug", action="store_true", help="show tracebacks")


def add_qlora_detail_flags(parser: argparse.ArgumentParser) -> None:
    """How the run's bitsandbytes holds and computes --qlora's 4-bit layers (trace/finetune.py)."""
    d = setup_default
    parser.add_argument("--bnb-version", metavar="X.Y.Z", help="--qlora: the bitsandbytes the run used; before 0.43.2 "
                        "each 4-bit layer kept its input until the graph was freed" + d("bnb_version", "installed, else the newest"))
    parser.add_argument("--bnb-quant", metavar="nf4-dq|nf4", help="--qlora: double-quantized statistics "
                        "(bnb_4bit_use_double_quant) or an fp32 absmax per 64 values" + d("bnb_quant", "nf4-dq"))
    parser.add_argument("--bnb-compute-dtype", metavar="bf16|fp16|fp32", help="--qlora: bnb_4bit_compute_dtype, the "
                        "dtype each 4-bit layer dequantizes to and multiplies in; BitsAndBytesConfig's own default is "
                        "fp32" + d("bnb_compute_dtype", "bf16, QLoRA's recipe; fp16 under --precision fp16-mixed"))
    parser.add_argument("--qlora-layers", metavar="transformers|all", help="--qlora: the linear layers transformers' "
                        "quantizer converts, or all of them with the output layer (Lightning Fabric, LitGPT)"
                        + d("qlora_layers", "transformers"))


def add_load_flags(parser: argparse.ArgumentParser) -> None:
    """How the weights arrive before training (setup/loading.py, trace/checkpoint_load.py)."""
    d = setup_default
    parser.add_argument("--load", metavar="none|state-dict|state-dict-cpu", help="the checkpoint read before "
                        "training: state-dict is torch.load(path, map_location=<the device>) then load_state_dict "
                        "(the checkpoint's copy beside the model's until it is deleted); state-dict-cpu reads it "
                        "into host RAM and copies it in" + d("load", "none: the model is built where it trains"))
    parser.add_argument("--resume", action=argparse.BooleanOptionalAction, default=None, help="--load: the "
                        "checkpoint holds the optimizer's state too (optimizer.load_state_dict)" + d("resume"))
    parser.add_argument("--checkpoint-dtype", metavar="fp32|bf16|fp16", help="--load: the dtype the checkpoint "
                        "stores floating tensors in" + d("checkpoint_dtype", "the model's own"))


def add_target_flags(parser: argparse.ArgumentParser) -> None:
    """What the run trains on: the device, its CUDA and allocator settings, and the framework."""
    parser.add_argument("--device", metavar="DEVICE", help="cpu | a GPU from `trainmem devices` | custom:capacity=24GiB,cc=8.9"
                        + run_default("device"))
    parser.add_argument("--cuda-context", metavar="SIZE", help="GPU devices: CUDA context bytes in nvidia-smi "
                        "(default: the device's)")
    parser.add_argument("--alloc-conf", metavar="SETTINGS", help="GPU devices: PYTORCH_CUDA_ALLOC_CONF of the "
                        "run, e.g. expandable_segments:True (default: PYTORCH_[CUDA_]ALLOC_CONF of the environment; none)")
    parser.add_argument("--cuda-version", metavar="X.Y", help="GPU devices: the run's CUDA (default: this "
                        "torch's; CPU builds: 12.8)")
    parser.add_argument("--module-loading", choices=MODULE_LOADING.choices, help="GPU devices: CUDA_MODULE_LOADING of "
                        "the run (default: lazy; eager before CUDA 11.7)")
    parser.add_argument("--cudnn-benchmark", action="store_true", default=None,
                        help="GPU devices: torch.backends.cudnn.benchmark = True in the run (default: off)")
    parser.add_argument("--framework", metavar="auto|torch|keras", help="how MODEL is read: auto takes .keras files, "
                        "SavedModel directories and factories that import keras as Keras, the rest as PyTorch"
                        + run_default("framework"))
    parser.add_argument("--keras-backend", metavar="tensorflow|torch", help="Keras models: the backend Keras trains "
                        "on (torch: traced by the PyTorch engine) (default: tensorflow, or the backend of a Keras "
                        "already imported)")
    parser.add_argument("--tf-memory", metavar="MODE", help="Keras on TensorFlow, GPU devices: default (TensorFlow "
                        "maps almost all GPU memory at start) | growth (allow_growth) | limit:SIZE (a logical "
                        "device's memory_limit) | fraction:F (per_process_gpu_memory_fraction) (default: default)")
    parser.add_argument("--tf-onednn", metavar="auto|on|off", help="Keras on TensorFlow, CPU: whether the run has "
                        "oneDNN and its MklCPUAllocator (on/off: TF_ENABLE_ONEDNN_OPTS=1/0; auto: as TensorFlow "
                        "decides, from TF_ENABLE_ONEDNN_OPTS here and this CPU's features) (default: auto)")


def timeout_seconds(text: str) -> float:
    """--timeout: seconds, more than 0 and at most a week (supervised.py)."""
    from trainmem.supervised import MAX_TIMEOUT_SECONDS

    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value <= MAX_TIMEOUT_SECONDS:
        raise TrainmemError(f"expected seconds above 0 and at most {MAX_TIMEOUT_SECONDS:,}, got {text!r}",
                            where="--timeout")
    return value


def add_keras_data_flags(parser: argparse.ArgumentParser) -> None:
    """What model.fit holds beside the step (targets/tf/cpu_process.py): the arrays it trains on."""
    parser.add_argument("--dataset-size", type=int, metavar="SAMPLES", help="Keras on TensorFlow, CPU: samples in "
                        "the numpy arrays model.fit trains on, held in memory (peak RSS holds them 1-2x) (default: "
                        "as many batches as are traced)")


def add_process_flags(parser: argparse.ArgumentParser) -> None:
    """How the `trainmem` command supervises the process that runs the model's code (supervised.py)."""
    from trainmem.supervised import DEFAULT_TIMEOUT_SECONDS

    parser.add_argument("--timeout", type=timeout_seconds, metavar="SECONDS", help="stop the model's code after "
                        "this long: exit 2 with one line (the command runs it in a worker process it can stop) "
                        f"(default: {DEFAULT_TIMEOUT_SECONDS:,} s)")
    parser.add_argument("--no-cache", action="store_true", default=None, help="trace the run again rather than "
                        "reuse the trace of the same run kept in the cache directory (`trainmem cache` lists and "
                        "clears it) (default: reuse)")


def add_output_flags(parser: argparse.ArgumentParser) -> None:
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
    from trainmem.cli.commands import COMMAND_MODULES
    from trainmem.cli.parallel_flags import add_parallel_flags

    formatter = argparse.RawDescriptionHelpFormatter
    references = references_help()
    parser = Parser(prog="trainmem", description="How much memory will training take — before you train.",
                    epilog=references, formatter_class=formatter)
    parser.add_argument("--debug", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--version", action="version", version=f"trainmem {_version()}")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=Parser)

    def add(name: str, text: str) -> argparse.ArgumentParser:  # a command of a MODEL: the setup and many-GPU flags
        parser = commands.add_parser(name, help=text, description=text, epilog=references, formatter_class=formatter)
        add_setup_flags(parser)
        add_keras_data_flags(parser)
        add_process_flags(parser)
        add_parallel_flags(parser)
        return parser

    for module in COMMAND_MODULES:  # in the order --help lists them
        module.add(commands, add)
    return parser
