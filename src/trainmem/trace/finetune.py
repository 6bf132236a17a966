"""Fine-tuning applied to a built model (on meta, before materialization): LoRA through peft, and
QLoRA's 4-bit NF4 base weights through a stand-in for bitsandbytes' Linear4bit.

Why a stand-in for bitsandbytes: its 4-bit kernels need CUDA and cannot run on fake CPU tensors. The
stand-in keeps what bitsandbytes keeps (bitsandbytes/nn/modules.py Linear4bit, Params4bit;
functional.quantize_4bit with compress_statistics=True):
* the packed weight: one uint8 per two values;
* double-quantized statistics: one uint8 absmax per 64-value block, one fp32 absmax per 256 blocks,
  a 256-entry fp32 code table and an fp32 offset;
and does what its matmul_4bit does in training (Linear4bit.forward, MatMul4Bit): cast the input and bias to the
compute dtype (bnb_4bit_compute_dtype), dequantize the whole weight into a transient tensor of the dtype it was
quantized from (the quant state's dtype: the load dtype, bf16 in QLoRA's recipe) and cast that to the compute dtype
where they differ, multiply (under autocast, F.linear casts both again), cast the output back; backward dequantizes
again, cast to the gradient's dtype, for the input's gradient and, since 0.43.2, saves no activation.
The layers left in full precision are transformers' own choice (the output embeddings, tied weights,
_keep_in_fp32_modules such as T5's `wo`), and prepare_model_for_kbit_training keeps every other
parameter in fp32.

Older releases kept more (BnbBehaviour): the release is --bnb-version, else the installed one, else the newest.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata

import torch

from trainmem.errors import SetupError
from trainmem.setup import LoraSpec, TrainingSetup, presets

NF4_BLOCK = 64  # bitsandbytes quantize_4bit blocksize
NESTED_BLOCK = 256  # compress_statistics: absmax quantized in blocks of 256
COMPUTE_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}  # --bnb-compute-dtype
RECIPE_COMPUTE_DTYPE = "bf16"  # bnb_4bit_compute_dtype in the QLoRA recipe (BitsAndBytesConfig's own default: fp32)
# The dtype a weight is quantized from (from_pretrained's torch_dtype) is the quant state's, and dequantize_4bit's
# output dtype. The recipe loads in the dtype it computes in (bf16, or fp16 where the GPU has no bf16). Under fp32
# compute the weights were loaded in fp32 (transformers 4's default) or bf16 (transformers 5's dtype="auto" on a bf16
# checkpoint): bf16 is taken, the larger transient (a bf16 copy, then its fp32 cast).
FP32_COMPUTE_LOAD_DTYPE = torch.bfloat16


# What a bitsandbytes release does in training that moves memory, by the first release that changed it
# (bitsandbytes/autograd/_functions.py MatMul4Bit, nn/modules.py Params4bit):
# * before 0.43.2 MatMul4Bit.forward kept its input A on the context (`ctx.tensors = (A, B)`) whenever an input
#   needs a gradient. A context attribute is not save_for_backward: backward does not release it and checkpointing's
#   hooks never see it, so every 4-bit layer's input lives until the autograd graph itself is freed (when the loop
#   drops its loss, in an inline loop after the next forward). bitsandbytes #1270 ("fix QLoRA mem bug: delete
#   useless buffered activation", 0.43.2) keeps only B.
# * before 0.43.0 Params4bit.cuda quantized `self.data.contiguous().half()`: dequantize_4bit returns fp16 and
#   MatMul4Bit's `.to(A.dtype)` makes a second copy under bf16 compute. 0.43.0 quantizes in the weight's own dtype.
KEEPS_INPUT_BEFORE = (0, 43, 2)
FP16_STATE_BEFORE = (0, 43, 0)


@dataclasses.dataclass(frozen=True)
class BnbBehaviour:
    release: tuple[int, int, int] | None  # None: no release given or installed, the newest behaviour
    origin: str  # "--bnb-version", "installed", or "newest"
    keeps_input: bool = False
    fp16_state: bool = False
    double_quant: bool = True  # --bnb-quant nf4-dq (bnb_4bit_use_double_quant, compress_statistics) or nf4
    compute: str = RECIPE_COMPUTE_DTYPE  # --bnb-compute-dtype: bf16, fp16 or fp32

    @property
    def compute_dtype(self) -> torch.dtype:
        return COMPUTE_DTYPES[self.compute]

    def describe(self) -> str:
        if self.release is None:
            return ("bitsandbytes as released since 0.43.2 (none installed here; --bnb-version X.Y.Z for a run made "
                    "with an older one)")
        version = ".".join(map(str, self.release))
        kept = []
        if self.keeps_input:
            kept.append("keeps each 4-bit layer's input until the autograd graph is freed (before 0.43.2, "
                        "bitsandbytes #1270)")
        if self.fp16_state:
            kept.append("dequantizes through an fp16 copy (before 0.43.0)")
        return f"bitsandbytes {version} ({self.origin})" + (": " + "; ".join(kept) if kept else "")


def bnb_behaviour(given: tuple[int, int, int] | None, double_quant: bool = True,
                  compute: str = RECIPE_COMPUTE_DTYPE) -> BnbBehaviour:
    """The behaviour of the release the run uses: the one given, else the installed one (read from its metadata,
    never imported: its import looks for CUDA), else the newest."""
    release, origin = given, "--bnb-version"
    if release is None:
        try:
            release, origin = presets.bnb_release(importlib.metadata.version("bitsandbytes")), "installed"
        except (importlib.metadata.PackageNotFoundError, SetupError):
            return BnbBehaviour(None, "newest", double_quant=double_quant, compute=compute)
    return BnbBehaviour(release, origin, keeps_input=release < KEEPS_INPUT_BEFORE,
                        fp16_state=release < FP16_STATE_BEFORE, double_quant=double_quant, compute=compute)


def default_compute_dtype(setup: TrainingSetup) -> str:
    """bf16, QLoRA's recipe; fp16 under fp16 precision, what a GPU without bf16 (before compute capability 8.0) runs."""
    return "fp16" if str(setup.precision).startswith("fp16") else RECIPE_COMPUTE_DTYPE


def _dequantized_weight(shape: tuple[int, int], like: torch.Tensor, behaviour: BnbBehaviour) -> torch.Tensor:
    """`dequantize_4bit(B, state).to(like.dtype)`: the output is in the dtype the weight was quantized from (fp16 for
    releases that quantized `.half()`, else the load dtype: FP32_COMPUTE_LOAD_DTYPE's comment), cast where `like`
    (the input in the compute dtype, or the output's gradient) has another; the first copy is freed on return."""
    compute = behaviour.compute_dtype
    quantized_from = (torch.float16 if behaviour.fp16_state
                      else FP32_COMPUTE_LOAD_DTYPE if compute == torch.float32 else compute)
    if quantized_from != like.dtype:
        return torch.empty(shape, dtype=quantized_from, device=like.device).to(like.dtype)
    return torch.empty(shape, dtype=like.dtype, device=like.device)


class _Dequantized(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, packed, out_features: int, in_features: int, bias, behaviour: BnbBehaviour):
        ctx.shape, ctx.behaviour = (out_features, in_features), behaviour
        output = torch.nn.functional.linear(x, _dequantized_weight(ctx.shape, x, behaviour), bias)
        if behaviour.keeps_input and any(ctx.needs_input_grad[:2]):
            ctx.tensors = (x, packed)  # as MatMul4Bit did: an attribute, alive with the graph
        return output

    @staticmethod
    def backward(ctx, grad):
        weight = _dequantized_weight(ctx.shape, grad, ctx.behaviour)  # dequantized again
        return grad @ weight, None, None, None, None, None


class NF4Linear(torch.nn.Linear):
    """A frozen linear layer stored as bitsandbytes stores a 4-bit NF4 weight (an nn.Linear subclass so
    that peft can wrap it as a base layer)."""

    keeps_dtype = ("absmax", "nested_absmax", "code", "offset")  # fp32 in a bf16 run too (trace/run.py)

    def __init__(self, linear: torch.nn.Linear, behaviour: BnbBehaviour) -> None:
        torch.nn.Module.__init__(self)
        self.behaviour = behaviour
        self.in_features, self.out_features = linear.in_features, linear.out_features
        numel = self.in_features * self.out_features
        self.quantized_values = numel  # the weight's parameter count, as the unquantized model counts it
        device = linear.weight.device
        self.weight = torch.nn.Parameter(torch.empty((numel + 1) // 2, 1, dtype=torch.uint8, device=device),
                                         requires_grad=False)
        self.bias = None if linear.bias is None else torch.nn.Parameter(linear.bias.detach(), requires_grad=False)
        blocks = -(-numel // NF4_BLOCK)
        # the statistics are fp32 whatever the model's dtype (quantize_4bit makes absmax float32; the nested state's
        # absmax, code and offset too): not the default dtype, which is the load dtype while a bf16 model is built
        fp32 = dict(dtype=torch.float32, device=device)
        if behaviour.double_quant:  # compress_statistics: the absmax quantized to uint8 in blocks of 256
            self.register_buffer("absmax", torch.empty(blocks, dtype=torch.uint8, device=device))
            self.register_buffer("nested_absmax", torch.empty(-(-blocks // NESTED_BLOCK), **fp32))
            self.register_buffer("code", torch.empty(256, **fp32))  # the nested state's dynamic map
            self.register_buffer("offset", torch.empty((), **fp32))
        else:  # an fp32 absmax per block and the 16-entry NF4 code (functional.get_4bit_type)
            self.register_buffer("absmax", torch.empty(blocks, **fp32))
            self.register_buffer("code", torch.empty(16, **fp32))

    def _apply(self, fn, recurse=True):
        """`model.to(dtype)` (a bf16 run casts the model) leaves the statistics fp32: bitsandbytes keeps them in the
        weight's quant state, which no module cast reaches. A move to another device moves them."""
        statistics = {name: b for name, b in self._buffers.items() if name in self.keeps_dtype and b is not None}
        super()._apply(fn, recurse)
        for name, before in statistics.items():
            after = self._buffers[name]
            if after.dtype != before.dtype and after.device == before.device:
                self._buffers[name] = before
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        original, compute = x.dtype, self.behaviour.compute_dtype
        bias = None if self.bias is None else self.bias.to(compute)
        out = _Dequantized.apply(x.to(compute), self.weight, self.out_features, self.in_features, bias,
                                 self.behaviour)
        return out.to(original)

    def storage_bytes(self) -> int:
        """The packed weight and its quantization statistics (absmax, nested absmax, code, offset)."""
        return sum(t.numel() * t.element_size() for t in (self.weight, *self.buffers(recurse=False)))


def quantized_facts(model: torch.nn.Module) -> dict[int, int]:
    """id of each NF4 packed weight -> the parameter count it stands for (a packed uint8 element holds two
    values, so counting elements would report half the model's weights)."""
    return {id(m.weight): m.quantized_values for m in model.modules() if isinstance(m, NF4Linear)}


def quantized_storage_bytes(model: torch.nn.Module) -> int:
    return sum(m.storage_bytes() for m in model.modules() if isinstance(m, NF4Linear))


# peft names every LoRA parameter under a module whose name starts with its tuner prefix (peft/tuners/lora/
# model.py LoraModel.prefix = "lora_": lora_A, lora_B, lora_embedding_A/B, lora_magnitude_vector)
ADAPTER_PREFIX = "lora_"


def adapter_parameters(model: torch.nn.Module) -> int:
    """Parameters LoRA added to the model (tied ones once)."""
    unique = {id(p): p for name, p in model.named_parameters()
              if any(part.startswith(ADAPTER_PREFIX) for part in name.split("."))}
    return sum(p.numel() for p in unique.values())


def lora_used(model: torch.nn.Module) -> dict | None:
    """The LoRA settings peft applied, after its own resolution (`all-linear` and an architecture's
    defaults become module names), and how many layers got an adapter; None without LoRA."""
    config = getattr(model, "peft_config", {}).get("default")
    if config is None or not hasattr(config, "lora_alpha"):  # another peft method (IA3, OFT, prompt tuning...)
        return None
    adapted = sum(1 for m in model.modules() if hasattr(m, "lora_A") and "default" in getattr(m, "lora_A", {}))
    targets = config.target_modules  # peft may list full module paths: their short names say the same
    names = sorted({_short_name(t) for t in targets}) if isinstance(targets, (set, list, tuple)) else targets
    return {"r": config.r, "alpha": config.lora_alpha, "dropout": config.lora_dropout, "targets": names,
            "adapted_layers": adapted}


def _output_layer(model: torch.nn.Module) -> torch.nn.Module | None:
    getter = getattr(model, "get_output_embeddings", None)
    return getter() if callable(getter) else None


def _transformers_keeps(model: torch.nn.Module):
    """transformers' own test for which linear layers its bitsandbytes 4-bit quantizer converts, or None
    for a model that is not a transformers model. The quantizer leaves out tied weights, the last
    module, the output embeddings and the model's _keep_in_fp32_modules (T5 keeps `wo` in fp32), and
    matches names by prefix, pattern or suffix (quantizers/base.py get_modules_to_not_convert,
    quantizers_utils.should_convert_module)."""
    try:
        from transformers import PreTrainedModel
        from transformers.quantizers.base import HfQuantizer
        from transformers.quantizers.quantizers_utils import should_convert_module
    except ImportError:
        return None
    if not isinstance(model, PreTrainedModel):
        return None
    skip = HfQuantizer.get_modules_to_not_convert(model, None, getattr(model, "_keep_in_fp32_modules", None))
    return lambda name: should_convert_module(name, skip)


def _tied(model: torch.nn.Module) -> set[int]:
    """ids of the linear layers whose weight another module also holds (an output layer tied to the embeddings)."""
    holders: dict[int, int] = {}
    for module in model.modules():
        for parameter in module.parameters(recurse=False):
            holders[id(parameter)] = holders.get(id(parameter), 0) + 1
    return {id(m) for m in model.modules() if isinstance(m, torch.nn.Linear) and holders.get(id(m.weight), 0) > 1}


def quantize_4bit(model: torch.nn.Module, behaviour: BnbBehaviour, every_linear: bool = False) -> int:
    """Replace the linear layers bitsandbytes would quantize by NF4Linear; returns how many. For a
    transformers model that is transformers' own choice; otherwise every nn.Linear but the output layer.
    every_linear (--qlora-layers all): every nn.Linear whose weight is its own, the output layer too, as
    Lightning Fabric's BitsandbytesPrecision converts them (LitGPT's --quantize)."""
    converts = _transformers_keeps(model)
    keep = _output_layer(model)
    tied = _tied(model) if every_linear else set()
    count = 0
    for parent_name, parent in list(model.named_modules()):
        for name, child in list(parent.named_children()):
            full_name = f"{parent_name}.{name}" if parent_name else name
            if type(child) is not torch.nn.Linear:
                continue
            if every_linear:
                quantized = id(child) not in tied
            else:
                quantized = converts(full_name) if converts is not None else child is not keep
            if quantized:
                setattr(parent, name, NF4Linear(child, behaviour))
                count += 1
    return count


def apply_lora(model: torch.nn.Module, spec: LoraSpec) -> torch.nn.Module:
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError:
        raise SetupError("expected peft for --lora/--qlora; install it with pip install 'trainmem[hf]'",
                         where="--lora") from None
    targets = list(spec.targets) if spec.targets else None
    if targets == ["all-linear"]:
        targets = "all-linear"
    config = LoraConfig(r=spec.r, lora_alpha=spec.alpha, lora_dropout=spec.dropout, target_modules=targets)
    try:
        return get_peft_model(model, config)
    except (ValueError, TypeError) as error:
        message = str(error).splitlines()[0] if str(error) else type(error).__name__
        if "target" in message:  # no defaults for this architecture, or no module matched
            raise SetupError(f"expected LoRA targets that name modules of this model ({message.rstrip('.')}); "
                             f"its linear layers are named {_linear_names(model)}", where="--lora") from None
        raise SetupError(f"expected a LoRA configuration peft accepts for this model, peft says: {message}",
                         where="--lora") from None


def _short_name(name: str) -> str:
    """ "layers.3.self_attn.q_proj" -> "q_proj"; "blocks.3.mlp.0" -> "mlp.0": a bare index names nothing."""
    parts = name.split(".")
    return ".".join(parts[-2:]) if parts[-1].isdigit() and len(parts) > 1 else parts[-1]


def _linear_names(model: torch.nn.Module, most: int = 12) -> str:
    """The distinct last names of the model's linear and convolution layers, for `targets=`."""
    names = list(dict.fromkeys(_short_name(name) for name, module in model.named_modules()
                               if isinstance(module, (torch.nn.Linear, torch.nn.Conv1d, torch.nn.Conv2d)) and name))
    return ", ".join(names[:most]) + (f" and {len(names) - most} more" if len(names) > most else "") or "(none)"


def apply(model: torch.nn.Module, setup: TrainingSetup) -> tuple[torch.nn.Module, list[str]]:
    """The fine-tuning the setup asks for; returns the model and notes for the report."""
    notes: list[str] = []
    if setup.qlora:
        behaviour = bnb_behaviour(None if setup.bnb_version is None else presets.bnb_release(setup.bnb_version),
                                  double_quant=setup.bnb_quant != "nf4",
                                  compute=setup.bnb_compute_dtype or default_compute_dtype(setup))
        count = quantize_4bit(model, behaviour, every_linear=setup.qlora_layers == "all")
        packed = quantized_facts(model)
        full = sum(p.numel() for p in model.parameters() if id(p) not in packed)
        total = full + sum(packed.values())
        statistics = "double-quantized statistics" if behaviour.double_quant else "an fp32 absmax per 64 values"
        kept = ("tied layers (--qlora-layers all)" if setup.qlora_layers == "all" else "the layers transformers keeps")
        notes.append(f"QLoRA: {count} linear layers hold 4-bit NF4 weights (packed uint8, {statistics}), dequantized "
                     f"to {behaviour.compute} per use (bnb_4bit_compute_dtype, --bnb-compute-dtype); {full:,} "
                     f"parameters ({full / max(total, 1):.1%}) stay in full precision "
                     f"(embeddings, norms, {kept}, and weights that are not nn.Linear, such as fused mixture-of-experts "
                     "weights); " + behaviour.describe())
    spec = setup.lora_spec()
    if setup.own_adapters:
        trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
        notes.append(f"LoRA: the model's own adapters (--lora own), {trainable:,} trainable parameters")
    if spec is not None:
        model = apply_lora(model, spec)
        targets = ", ".join(spec.targets) if spec.targets else "peft's defaults for this architecture"
        notes.append(f"LoRA r={spec.r}, alpha={spec.alpha}, dropout={spec.dropout}, on {targets} (peft)")
    return model, notes
