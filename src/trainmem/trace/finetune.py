"""Fine-tuning applied to a built model (on meta, before materialization): LoRA through peft, and
QLoRA's 4-bit NF4 base weights through a stand-in for bitsandbytes' Linear4bit.

Why a stand-in for bitsandbytes: its 4-bit kernels need CUDA and cannot run on fake CPU tensors. The
stand-in keeps what bitsandbytes keeps (bitsandbytes/nn/modules.py Linear4bit, Params4bit;
functional.quantize_4bit with compress_statistics=True):
* the packed weight: one uint8 per two values;
* double-quantized statistics: one uint8 absmax per 64-value block, one fp32 absmax per 256 blocks,
  a 256-entry fp32 code table and an fp32 offset;
and does what its matmul_4bit does in training: cast the input to the compute dtype, dequantize the
whole weight into a transient tensor of the compute dtype, multiply, cast the output back; backward
dequantizes again for the input's gradient and saves no activation (MatMul4Bit).
The output layer stays in full precision (transformers' get_keys_to_not_convert keeps the output
embeddings), and prepare_model_for_kbit_training keeps every other parameter in fp32.
"""

from __future__ import annotations

import torch

from trainmem.errors import SetupError
from trainmem.setup import LoraSpec, TrainingSetup

NF4_BLOCK = 64  # bitsandbytes quantize_4bit blocksize
NESTED_BLOCK = 256  # compress_statistics: absmax quantized in blocks of 256
COMPUTE_DTYPE = torch.bfloat16  # bnb_4bit_compute_dtype in the QLoRA recipe


class _Dequantized(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, packed, out_features: int, in_features: int, bias):
        ctx.shape = (out_features, in_features)
        weight = torch.empty(ctx.shape, dtype=x.dtype, device=x.device)  # dequantize_4bit's output
        return torch.nn.functional.linear(x, weight, bias)

    @staticmethod
    def backward(ctx, grad):
        weight = torch.empty(ctx.shape, dtype=grad.dtype, device=grad.device)  # dequantized again
        return grad @ weight, None, None, None, None


class NF4Linear(torch.nn.Linear):
    """A frozen linear layer stored as bitsandbytes stores a 4-bit NF4 weight (an nn.Linear subclass so
    that peft can wrap it as a base layer)."""

    def __init__(self, linear: torch.nn.Linear) -> None:
        torch.nn.Module.__init__(self)
        self.in_features, self.out_features = linear.in_features, linear.out_features
        numel = self.in_features * self.out_features
        device = linear.weight.device
        self.weight = torch.nn.Parameter(torch.empty((numel + 1) // 2, 1, dtype=torch.uint8, device=device),
                                         requires_grad=False)
        self.bias = None if linear.bias is None else torch.nn.Parameter(linear.bias.detach(), requires_grad=False)
        blocks = -(-numel // NF4_BLOCK)
        self.register_buffer("absmax", torch.empty(blocks, dtype=torch.uint8, device=device))
        self.register_buffer("nested_absmax", torch.empty(-(-blocks // NESTED_BLOCK), device=device))
        self.register_buffer("code", torch.empty(256, device=device))
        self.register_buffer("offset", torch.empty((), device=device))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        original = x.dtype
        bias = None if self.bias is None else self.bias.to(COMPUTE_DTYPE)
        out = _Dequantized.apply(x.to(COMPUTE_DTYPE), self.weight, self.out_features, self.in_features, bias)
        return out.to(original)


def _output_layer(model: torch.nn.Module) -> torch.nn.Module | None:
    getter = getattr(model, "get_output_embeddings", None)
    return getter() if callable(getter) else None


def quantize_4bit(model: torch.nn.Module) -> int:
    """Replace every nn.Linear but the output layer by an NF4Linear; returns how many."""
    keep = _output_layer(model)
    count = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is torch.nn.Linear and child is not keep:
                setattr(parent, name, NF4Linear(child))
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
        raise SetupError(f"expected LoRA targets that name modules of this model: {str(error).splitlines()[0]}",
                         where="--lora") from None


def apply(model: torch.nn.Module, setup: TrainingSetup) -> tuple[torch.nn.Module, list[str]]:
    """The fine-tuning the setup asks for; returns the model and notes for the report."""
    notes: list[str] = []
    if setup.qlora:
        count = quantize_4bit(model)
        notes.append(f"QLoRA: {count} linear layers hold 4-bit NF4 weights (packed uint8, double-quantized "
                     "statistics), dequantized to bf16 per use; the output layer stays full precision")
    spec = setup.lora_spec()
    if spec is not None:
        model = apply_lora(model, spec)
        targets = ", ".join(spec.targets) if spec.targets else "peft's defaults for this architecture"
        notes.append(f"LoRA r={spec.r}, alpha={spec.alpha}, dropout={spec.dropout}, on {targets} (peft)")
    return model, notes
