"""What a training run is: frozen dataclasses and enums, built the same from CLI flags, a TOML file
or Python. Strings become enums here, at the edge, so bad input fails at once. No torch."""

from __future__ import annotations

import dataclasses
import enum
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from trainmem.errors import SetupError, expected, one_line, unknown_key
from trainmem.files import regular_file
# the bounds stay importable from here (trace/step.py, cli/ and tests read them as trainmem.setup's)
from trainmem.setup.count_limits import MAX_ELEMENTS as MAX_ELEMENTS, MAX_GRAD_ACCUM as MAX_GRAD_ACCUM, check_counts
from trainmem.setup.count_limits import positive_finite
from trainmem.setup.count_limits import MAX_RUN_STEPS as MAX_RUN_STEPS, MAX_TRACE_STEPS as MAX_TRACE_STEPS, sequence_lengths
from trainmem.setup.layout import ParallelLayout
from trainmem.setup.loading import Load as Load, check_loading
from trainmem.setup.lora import OWN_ADAPTERS, QLORA_LORA as QLORA_LORA, LoraSpec as LoraSpec
from trainmem.setup import presets
from trainmem.setup.trainers import Trainer as Trainer
from trainmem.setup.presets import HF_TRAINER_DEFAULTS as HF_TRAINER_DEFAULTS, QLORA_DEFAULTS as QLORA_DEFAULTS


class Optimizer(enum.StrEnum):
    SGD = "sgd"
    MOMENTUM = "momentum"  # SGD with momentum 0.9: one buffer per parameter
    ADAM = "adam"
    ADAMW = "adamw"
    RMSPROP = "rmsprop"
    ADAGRAD = "adagrad"
    ADAFACTOR = "adafactor"  # torch.optim.Adafactor: factored second moments, no first moment
    LION = "lion"  # one momentum buffer (trace/optimizers.py)
    ADAMW_8BIT = "adamw-8bit"  # bitsandbytes AdamW8bit's state layout (trace/optimizers.py)
    PAGED_ADAMW_8BIT = "paged-adamw-8bit"  # the same, large states in CUDA managed memory
    PAGED_ADAMW = "paged-adamw"  # bitsandbytes PagedAdamW: 32-bit states, large ones in CUDA managed memory


ADAM_FAMILY = (Optimizer.ADAM, Optimizer.ADAMW)  # the optimizers the "16 bytes per parameter" and 8-bit rules speak of


class OptimizerImpl(enum.StrEnum):
    DEFAULT = "default"  # what torch picks: for-loop on CPU tensors, foreach on CUDA tensors
    FOREACH = "foreach"
    FOR_LOOP = "for-loop"
    FUSED = "fused"


class Precision(enum.StrEnum):
    FP32 = "fp32"
    FP16_MIXED = "fp16-mixed"  # autocast fp16 + GradScaler, fp32 master weights
    BF16_MIXED = "bf16-mixed"  # autocast bf16, fp32 master weights, no scaler
    BF16 = "bf16"  # parameters, gradients, state and activations all bf16


class ZeroGrad(enum.StrEnum):
    NONE = "none"  # zero_grad(set_to_none=True), torch >= 2.0's default: gradients are freed between steps
    ZEROS = "zeros"  # set_to_none=False, torch < 2.0's default: gradients stay allocated, filled with 0


class Loop(enum.StrEnum):
    """Which Python names keep the batch, the outputs and the loss alive (trace/loops.py shows the code
    each stands for)."""

    INLINE = "inline"  # PyTorch's tutorials: names live until the next iteration rebinds them
    STEP_FN = "step-fn"  # def train_step(...): outputs and loss die at return; the batch lives on
    TRAINER = "trainer"  # HF Trainer: outputs dropped before backward, batch through the step
    LEAN = "lean"  # outputs deleted before backward, batch and loss right after it
    LIGHTNING = "lightning"  # Lightning's automatic optimization: zero_grad between forward and backward
    LIGHTNING_ITERABLE = "lightning-iterable"  # the same over a loader without a length: one batch looked ahead


class Loss(enum.StrEnum):
    CROSS_ENTROPY = "cross-entropy"
    MSE = "mse"
    SUM = "sum"


class Activation(enum.StrEnum):
    RELU = "relu"
    TANH = "tanh"
    GELU = "gelu"
    SIGMOID = "sigmoid"


DTYPES = ("float32", "float16", "bfloat16", "float64", "int64", "int32", "uint8", "bool")


@dataclasses.dataclass(frozen=True)
class InputSpec:
    """One model input per sample: shape without the batch dimension, dtype, and for integer inputs
    the exclusive upper bound of the values (token ids < vocabulary size)."""

    shape: tuple[int, ...]
    dtype: str = "float32"
    max_value: int = 2

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise expected(f"an input dtype among {', '.join(DTYPES)}", self.dtype, "--input-dtype")
        if any((not isinstance(d, int)) or d <= 0 for d in self.shape):
            raise expected("positive integer dimensions such as 3,224,224", self.shape, "--input-shape")
        if self.max_value < 1:
            raise expected("--input-max of at least 1", self.max_value, "--input-max")

    @property
    def is_integer(self) -> bool:
        return self.dtype in ("int64", "int32", "uint8")


@dataclasses.dataclass(frozen=True)
class TrainingSetup:
    """Everything about one training run except the model itself."""

    batch_size: int = 1
    inputs: tuple[InputSpec, ...] = ()
    loss: Loss | None = None  # None: the model's own default, else cross-entropy
    target_shape: tuple[int, ...] | None = None  # per-sample target shape; None: made from the output
    optimizer: Optimizer = Optimizer.ADAM
    optimizer_impl: OptimizerImpl = OptimizerImpl.DEFAULT
    precision: Precision = Precision.FP32
    grad_accum: int = 1
    checkpointing: bool = False
    freeze: tuple[str, ...] = ()
    zero_grad: ZeroGrad = ZeroGrad.NONE
    steps: int = 2  # steps traced (--trace-steps, hidden); the run's own length is run_steps
    # the run's length in optimizer steps, for CPU peak RSS (alloc/steady_state.py: the heap keeps growing after
    # the traced steps); None: a long run, 32 steps replayed (bounded)
    run_steps: int | None = None
    activation: Activation = Activation.RELU  # used by mlp: references only
    dropout: float = 0.0  # used by mlp: references only
    task: str | None = None  # hf: references: causal-lm, masked-lm, … (None: the model's own)
    seq_len: int | None = None  # hf: references: tokens per sample (None: 512, capped by the model)
    trust_remote_code: bool = False  # hf: references: run the repository's own modeling code (config.json auto_map)
    lora: str | None = None  # "r=16,alpha=32,targets=q_proj,v_proj" (trace/finetune.py)
    qlora: bool = False  # 4-bit NF4 base weights + LoRA (QLORA_DEFAULTS unless given)
    hf_trainer: bool = False  # what transformers.Trainer does by default (HF_TRAINER_DEFAULTS unless given)
    trainer: Trainer | None = None  # whose code runs the step: its loop, its forward's wrapping (setup/trainers.py)
    max_grad_norm: float | None = None  # clip_grad_norm_ before each optimizer step
    torch_version: str | None = None  # the run's torch, for its defaults (setup/presets.py); None: this one's
    bnb_version: str | None = None  # the run's bitsandbytes, for --qlora (trace/finetune.py); None: the installed one
    bnb_quant: str | None = None  # --qlora's statistics: nf4-dq (None: double-quantized, QLoRA's recipe) or nf4
    qlora_layers: str | None = None  # --qlora's 4-bit layers: None, transformers' choice; "all", every nn.Linear
    bnb_compute_dtype: str | None = None  # --qlora's bnb_4bit_compute_dtype: None, bf16 (QLoRA's recipe); fp16; fp32
    seq_lengths: tuple[int, ...] | None = None  # the dataset's lengths for pack_padded_sequence; None: the bound
    loop: Loop = Loop.INLINE  # the user's training loop: what stays referenced (trace/loops.py)
    compile: bool = False  # model = torch.compile(model): the forward as Inductor compiles it (trace/compiled.py)
    parallel: ParallelLayout = ParallelLayout()  # ranks, strategy and knobs (setup/layout.py); resolved here
    load: Load = Load.NONE  # how the weights arrive before training (setup/loading.py), with the two below
    resume: bool = False  # the checkpoint holds the optimizer's state too
    checkpoint_dtype: str | None = None  # the checkpoint's floating dtype (fp32|bf16|fp16); None: the model's

    def __post_init__(self) -> None:
        if not isinstance(self.parallel, ParallelLayout):
            raise expected("a ParallelLayout", self.parallel, "parallel")
        object.__setattr__(self, "parallel", self.parallel.resolve())
        check_counts(self.batch_size, self.grad_accum, self.steps, self.run_steps, self.seq_len)
        if self.lora is not None and not self.own_adapters:
            LoraSpec.parse(self.lora)
        if self.target_shape is not None:
            object.__setattr__(self, "target_shape", parse_shape(self.target_shape, "--target-shape", allow_scalar=True))
        if not 0.0 <= float(self.dropout) < 1.0:
            raise expected("a dropout probability in [0, 1)", self.dropout, "--dropout")
        if self.max_grad_norm is not None and not positive_finite(self.max_grad_norm):
            # clip_grad_norm_ scales by max_norm / total_norm: a norm of 0 or less zeroes or flips every gradient
            raise expected("a positive gradient norm such as 1.0", self.max_grad_norm, "--max-grad-norm")
        presets.check_library_settings(self)
        object.__setattr__(self, "seq_lengths", sequence_lengths(self.seq_lengths))
        for name, enum_type in _ENUM_FIELDS.items():
            if getattr(self, name) is None and name in ("loss", "trainer"):
                continue
            object.__setattr__(self, name, _to_enum(enum_type, getattr(self, name), name))
        check_loading(self)

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any], where: str = "setup",
                     origins: Mapping[str, str] | None = None) -> TrainingSetup:
        """Build from plain values (TOML table, JSON, CLI dict); unknown keys are an error. `origins` says
        where a key's value came from ("run.toml: batch_size"), so that a bad value blames the file and
        key rather than a flag the user never typed; an API call (`where` "estimate()") names the
        keyword."""
        if origins is None and where.endswith("()"):
            origins = {key: f"{where[:-1]}{key}=…)" for key in values}
        try:
            return cls._from_mapping(values, where)
        except SetupError as error:
            raise _blame_origin(error, origins or {}) from None

    @classmethod
    def _from_mapping(cls, values: Mapping[str, Any], where: str) -> TrainingSetup:
        unknown = sorted(set(values) - SETUP_KEYS)
        if unknown:
            raise unknown_key(unknown[0], SETUP_KEYS, where, "setup keys are the CLI flags' names with underscores")
        names = {f.name for f in dataclasses.fields(cls)}
        kwargs = {k: v for k, v in values.items() if k in names}
        kwargs.update(_parallel_kwargs(values))
        kwargs = presets.apply(kwargs)
        for flag in ("checkpointing", "qlora", "hf_trainer", "trust_remote_code", "compile", "resume"):
            if flag in kwargs and not isinstance(kwargs[flag], bool):
                raise expected("true or false", kwargs[flag], f"--{flag.replace('_', '-')}")
        if "inputs" not in kwargs and "input_shape" in values:
            kwargs["inputs"] = parse_inputs(values["input_shape"], values.get("input_dtype"), values.get("input_max"))
        elif "input_dtype" in values or "input_max" in values:
            raise SetupError("expected input_shape with input_dtype/input_max, got none", where="--input-shape")
        if "inputs" in kwargs:
            if isinstance(kwargs["inputs"], (str, Mapping)) or not isinstance(kwargs["inputs"], Sequence):
                raise expected("inputs as a list of {shape, dtype, max_value} tables", kwargs["inputs"], "--input-shape")
            kwargs["inputs"] = tuple(_input_spec(item, where) for item in kwargs["inputs"])
        if "freeze" in kwargs:
            freeze = [kwargs["freeze"]] if isinstance(kwargs["freeze"], str) else kwargs["freeze"]
            if not isinstance(freeze, Sequence) or not all(isinstance(p, str) for p in freeze):
                raise expected("parameter name patterns (text)", kwargs["freeze"], "--freeze")
            kwargs["freeze"] = tuple(freeze)
        for name in ("loss", "optimizer", "optimizer_impl", "precision", "zero_grad", "activation", "loop", "task", "lora", "trainer",
                     "load", "checkpoint_dtype"):
            if kwargs.get(name) is not None and not isinstance(kwargs[name], (str, enum.Enum)):
                raise expected("text", kwargs[name], f"--{name.replace('_', '-')}")
        for name in ("dropout", "max_grad_norm"):
            value = kwargs.get(name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
                raise expected("a number", value, f"--{name.replace('_', '-')}")
        return cls(**kwargs)

    def flag_for(self, name: str) -> str:
        """The flag a user gave to get this field's value: --qlora and --hf-trainer fill in several
        (QLORA_DEFAULTS, HF_TRAINER_DEFAULTS), and an error about the value must name what was typed."""
        values = {key: getattr(self, key) for key in ("qlora", "hf_trainer", "torch_version", "trainer")}
        return presets.filled_by(values, name, getattr(self, name)) or f"--{name.replace('_', '-')}"

    @property
    def own_adapters(self) -> bool:
        """--lora own: the model brings its own LoRA adapters (LitGPT's lora.GPT; a model peft already wrapped), so
        none is added; --qlora still quantizes its linear layers."""
        return str(self.lora).strip().lower() == OWN_ADAPTERS

    def lora_spec(self) -> LoraSpec | None:
        if self.lora is not None:
            return None if self.own_adapters else LoraSpec.parse(self.lora)
        return QLORA_LORA if self.qlora else None

    @classmethod
    def from_toml(cls, path: str | Path) -> TrainingSetup:
        values = read_setup_file(path)
        unknown = sorted(set(values) - SETUP_KEYS)
        if unknown:
            raise unknown_key(unknown[0], SETUP_KEYS, str(path), "setup keys are the CLI flags' names with underscores")
        return cls.from_mapping(values, where=str(path), origins={key: f"{path}: {key}" for key in values})

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["inputs"] = [dataclasses.asdict(spec) for spec in self.inputs]
        for name in _ENUM_FIELDS:
            value = getattr(self, name)
            out[name] = None if value is None else str(value)
        out["freeze"] = list(self.freeze)
        out.pop("parallel")  # one process: the keys a single-process run always had, unchanged
        for key in ("torch_version", "bnb_version", "bnb_quant", "qlora_layers", "bnb_compute_dtype", "seq_lengths", "compile", "trainer",
                    "load", "resume", "checkpoint_dtype"):  # absent unless given: the keys other runs had, unchanged
            if out[key] is None or out[key] is False or out[key] == Load.NONE:
                out.pop(key)
        if self.parallel.distributed:
            out["parallel"] = self.parallel.to_dict()
        return out


# The layout's fields as flat setup keys (--strategy, --world-size, --dp …): what the CLI and TOML files give.
PARALLEL_KEYS = frozenset(f.name for f in dataclasses.fields(ParallelLayout))


def _parallel_kwargs(values: Mapping[str, Any]) -> dict[str, Any]:
    """`parallel` (a ParallelLayout or its to_dict()) or the flat keys, never both; {} when neither is given."""
    flat = {key: values[key] for key in PARALLEL_KEYS if key in values}
    given = values.get("parallel")
    if given is not None and flat:
        raise expected("either parallel or its flat keys (strategy, world_size, …)", sorted(flat)[0],
                       f"--{sorted(flat)[0].replace('_', '-')}")
    if isinstance(given, Mapping):
        unknown = sorted(set(given) - PARALLEL_KEYS)
        if unknown:
            raise unknown_key(unknown[0], PARALLEL_KEYS, "parallel", "the layout's keys are its flags' names")
        flat = dict(given)
    elif given is not None:
        return {"parallel": given}
    return {"parallel": ParallelLayout(**flat)} if flat else {}


SETUP_KEYS = frozenset({f.name for f in dataclasses.fields(TrainingSetup)} | {"input_shape", "input_dtype", "input_max"} | PARALLEL_KEYS)

# A setup file is a dozen keys: 64 KiB is a thousand times that; larger is not a setup (tomllib parses it whole)
MAX_SETUP_FILE_BYTES = 64 << 10


def read_setup_file(path: str | Path) -> dict[str, Any]:
    """A --setup TOML file's table: bounded in size, text, valid TOML; each failure one line naming the file."""
    where = str(path)
    regular_file(where, "a TOML setup file", SetupError)  # a FIFO nobody writes to would block the open for ever
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_SETUP_FILE_BYTES + 1)
    except OSError as error:
        raise SetupError(f"expected a readable TOML file, got {error.strerror or type(error).__name__}",
                         where=where) from None
    if len(data) > MAX_SETUP_FILE_BYTES:
        raise SetupError(f"expected a setup file of at most {MAX_SETUP_FILE_BYTES:,} bytes, got a larger file", where=where)
    try:
        return tomllib.loads(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise SetupError("expected a UTF-8 TOML file, got binary data", where=where) from None
    except tomllib.TOMLDecodeError as error:
        raise SetupError(f"expected valid TOML, got {one_line(error)}", where=where) from None
    except RecursionError:  # tomllib nests arrays by recursion
        raise SetupError("expected valid TOML, got arrays nested too deep to read", where=where) from None


def _blame_origin(error: SetupError, origins: Mapping[str, str]) -> SetupError:
    """Re-aim an error raised for a flag ('--batch-size') at where its value came from."""
    flag = (error.where or "").split(" ")[0]
    # two flags are not their key with dashes (flag_rules.FLAG_OF_KEY): --steps is run_steps, --trace-steps steps
    key = {"--steps": "run_steps", "--trace-steps": "steps"}.get(flag) or flag.removeprefix("--").replace("-", "_")
    if flag.startswith("--") and key in origins and origins[key] != flag:
        return type(error)(error.message, where=origins[key])
    if key.startswith("input_") and "inputs" in origins:
        return type(error)(error.message, where=origins["inputs"])
    return error


def _input_spec(item: Any, where: str) -> InputSpec:
    if isinstance(item, InputSpec):
        return item
    if isinstance(item, Mapping) and "shape" in item:
        max_value = item.get("max_value", 2)
        if isinstance(max_value, bool) or not isinstance(max_value, int):
            raise expected("an integer max_value", max_value, "--input-max")
        return InputSpec(parse_shape(item["shape"]), str(item.get("dtype", "float32")), max_value)
    raise expected("inputs as {shape, dtype, max_value} tables", item, where)


_ENUM_FIELDS: dict[str, type[enum.StrEnum]] = {
    "loss": Loss, "optimizer": Optimizer, "optimizer_impl": OptimizerImpl,
    "precision": Precision, "activation": Activation, "zero_grad": ZeroGrad, "loop": Loop, "trainer": Trainer, "load": Load}


def _to_enum(enum_type: type[enum.StrEnum], value: Any, name: str) -> enum.StrEnum:
    try:
        return enum_type(str(value).lower())
    except ValueError:
        choices = "|".join(member.value for member in enum_type)
        raise expected(f"{choices}", value, f"--{name.replace('_', '-')}") from None


def parse_shape(text: str | int | Sequence[int], where: str = "--input-shape",
                allow_scalar: bool = False) -> tuple[int, ...]:
    """'3,224,224' or '3x224x224' or [3, 224, 224] or (3, 224, 224) or 10 -> a tuple of positive ints;
    with allow_scalar, 'scalar' or [] -> () (one value per sample, such as a class id). Bools, floats
    and text such as '10.5' are refused, never rounded."""
    example, given = "comma-separated positive integers such as 3,224,224", text
    if isinstance(text, bool):
        raise expected(example, text, where)
    if isinstance(text, int):
        text = (text,)
    if allow_scalar and (text == "scalar" or (not isinstance(text, str) and isinstance(text, Sequence) and len(text) == 0)):
        return ()
    if isinstance(text, str):
        parts: list[Any] = text.replace("x", ",").replace(" ", "").split(",")
        if "" in parts:  # '3,,4' or '3,': a dimension left out, not a shape to guess
            raise expected(example, given, where)
    elif isinstance(text, Sequence):
        parts = list(text)
        if any(isinstance(p, bool) or not isinstance(p, int) for p in parts):
            raise expected(example, given, where)
    else:
        raise expected(example, given, where)
    try:
        shape = tuple(int(p) for p in parts)
    except (TypeError, ValueError):
        raise expected(example, given, where) from None
    if not shape or any(d <= 0 for d in shape):
        raise expected(example, given, where)
    return shape


def _one_shape(value: Any) -> bool:
    """A single shape (10, '3,224,224', (3, 224, 224)), as opposed to a list of shapes."""
    if isinstance(value, (str, int)):
        return True
    return isinstance(value, Sequence) and len(value) > 0 and all(isinstance(d, int) for d in value)


def parse_inputs(shapes: Any, dtypes: Any = None, maxima: Any = None) -> tuple[InputSpec, ...]:
    """Zip repeated --input-shape / --input-dtype / --input-max values into InputSpecs. A shape is
    '3,224,224', 10, (3, 224, 224) or [3, 224, 224]; several are a list of those. A single dtype or
    max applies to every input."""
    if shapes is None or (isinstance(shapes, Sequence) and not isinstance(shapes, str) and len(shapes) == 0):
        raise expected("an input shape such as 3,224,224", shapes, "--input-shape")
    shapes = [shapes] if _one_shape(shapes) else shapes
    if not isinstance(shapes, Sequence):
        raise expected("an input shape such as 3,224,224", shapes, "--input-shape")
    shapes = list(shapes)
    dtypes = _broadcast(dtypes, len(shapes), "float32", "--input-dtype")
    maxima = _broadcast(maxima, len(shapes), 2, "--input-max")
    for maximum in maxima:
        if isinstance(maximum, bool) or not isinstance(maximum, int):
            raise expected("an integer --input-max", maximum, "--input-max")
    return tuple(InputSpec(parse_shape(s), str(d), m) for s, d, m in zip(shapes, dtypes, maxima))


def _broadcast(values: Any, count: int, default: Any, where: str) -> list[Any]:
    if values is None or values == []:
        return [default] * count
    values = [values] if isinstance(values, (str, int)) else list(values)
    if len(values) == 1:
        return values * count
    if len(values) != count:
        raise expected(f"one {where} or one per --input-shape ({count})", values, where)
    return values
