"""Composite ops that decompose differently on CUDA, run as CUDA would on a CPU trace: attention
(scaled_dot_product_attention) and dropout.

On the CPU, F.scaled_dot_product_attention picks the CPU flash kernel or the math path. On CUDA,
select_sdp_backend (aten/src/ATen/native/transformers/cuda/sdp_utils.cpp) tries the fused backends
in priority order and takes the first whose constraints the inputs meet; each saves different
tensors for backward:

* flash (`_scaled_dot_product_flash_attention`): q, k, v, out, logsumexp [B, H, L] fp32, philox RNG state;
* memory-efficient (`_scaled_dot_product_efficient_attention`): q, k, v, out, the mask, logsumexp
  [B, H, ceil(L/32)·32] fp32, seed and offset;
* math: the decomposed softmax(QKᵀ)V — every intermediate, including the [B, H, L, S] weights.

The fused ops' meta kernels (torch/_meta_registrations.py) give their true output shapes on fake CPU
tensors, and derivatives.yaml gives what autograd saves, so calling the chosen op directly traces what
CUDA keeps. Under autocast, CUDA casts q, k, v (and a float mask) to the autocast dtype before the
choice (scaled_dot_product_attention is in autocast_mode.cpp's lower_precision_fp list).
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import math
from collections import Counter

import torch
import torch.nn.functional as F

from trainmem.device_catalog import flash_attention_for
from trainmem.trace import torch_private

FLASH = "flash"
EFFICIENT = "memory-efficient"
MATH = "math"


# true inside a pass that is no part of the training step (parallel/pp_run.py runs the stages once to learn their
# boundary shapes): its attention calls choose a backend as the step's do, but are not counted in the summary
_UNCOUNTED = contextvars.ContextVar("trainmem_attention_uncounted", default=False)


@contextlib.contextmanager
def attention_uncounted():
    token = _UNCOUNTED.set(True)
    try:
        yield
    finally:
        _UNCOUNTED.reset(token)


@dataclasses.dataclass(frozen=True)
class CudaFacts:
    """What the trace needs to know about the GPU (its compute capability), and what the CUDA target
    switches into the trace for it (trace.run.TraceSemantics): CUDA's autocast lists, the attention
    backend CUDA picks, CUDA's dropout, and CUDA's optimizer default."""

    compute_capability: tuple[int, int]
    cuda_semantics: bool = True

    @contextlib.contextmanager
    def switched_in(self):
        from trainmem.trace.cuda_autocast import cuda_autocast_kernels

        attention = CudaAttention(self)
        with cuda_autocast_kernels(), attention, cuda_dropout():
            yield attention


def _flash_ok(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask, cc: tuple[int, int], gqa: bool,
              is_causal: bool, dropout_p: float) -> bool:
    """sdp_utils.cpp can_use_flash_attention: sm80–sm121, fp16/bf16, no explicit mask, 4-D inputs,
    equal head dims of at most 256, a causal mask only on square inputs, and on sm86–89 and sm120–121
    no head dim in (192, 224], or above 192 with dropout, when training."""
    if not flash_attention_for(cc) or q.dim() != 4 or mask is not None:
        return False
    if q.dtype not in (torch.float16, torch.bfloat16) or not (q.dtype == k.dtype == v.dtype):
        return False
    head = q.shape[-1]
    if not (k.shape[-1] == v.shape[-1] == head) or head > 256:
        return False
    training = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    if training and ((8, 6) <= cc <= (8, 9) or (12, 0) <= cc <= (12, 1)) and head > 192 \
            and not (head > 224 and dropout_p == 0.0):
        return False
    if is_causal and q.shape[-2] != k.shape[-2]:
        return False
    return gqa or q.shape[1] == k.shape[1] == v.shape[1]


def _efficient_ok(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cc: tuple[int, int], gqa: bool) -> bool:
    """sdp_utils.cpp can_use_mem_efficient_attention: sm50–sm121, fp32/fp16 (bf16 from sm80), 4-D
    inputs, q and k head dims equal, q and v head dims a multiple of minimum_gemm_alignment."""
    if not (5, 0) <= cc <= (12, 1) or q.dim() != 4 or gqa and q.shape[1] != k.shape[1]:
        return False
    if q.dtype not in (torch.float32, torch.float16, torch.bfloat16) or not (q.dtype == k.dtype == v.dtype):
        return False
    if q.dtype == torch.bfloat16 and cc < (8, 0):
        return False
    # minimum_gemm_alignment: sm80+: max(4, 128 / bits); sm7x: 8 for half, 1 for fp32; older: 1
    if cc >= (8, 0):
        align = 4 if q.dtype == torch.float32 else 8
    else:
        align = 8 if cc >= (7, 0) and q.dtype != torch.float32 else 1
    return q.shape[-1] == k.shape[-1] and q.shape[-1] % align == 0 and v.shape[-1] % align == 0


class CudaAttention:
    """For the length of a trace, aten::scaled_dot_product_attention runs the backend CUDA would
    choose. The op is CompositeImplicitAutograd; a Python kernel registered for that key replaces the
    CPU decomposition, so the choice is made wherever the op is called: in forward, and again when
    torch.utils.checkpoint recomputes a block inside backward. Autocast's cast of q, k, v happens
    before (the op is in CUDA's lower_precision_fp list; trace/cuda_autocast.py)."""

    def __init__(self, facts: CudaFacts) -> None:
        self.facts = facts
        self.choices: Counter[str] = Counter()
        self._override = _CompositeOverride("scaled_dot_product_attention", self.attention)

    def __enter__(self) -> CudaAttention:
        self._override.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._override.__exit__(*exc)

    def attention(self, query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                  enable_gqa=False):
        return self._dispatch(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)

    def _dispatch(self, query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa):
        cc = self.facts.compute_capability
        grad = torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value))
        if _flash_ok(query, key, value, attn_mask, cc, enable_gqa, is_causal, dropout_p):
            self._count(FLASH)
            return torch.ops.aten._scaled_dot_product_flash_attention(
                query, key, value, dropout_p, is_causal, False, scale=scale)[0]
        if _efficient_ok(query, key, value, cc, enable_gqa):
            self._count(EFFICIENT)
            bias = _efficient_bias(attn_mask, query, key)
            return torch.ops.aten._scaled_dot_product_efficient_attention(
                query, key, value, bias, grad, dropout_p, is_causal, scale=scale)[0]
        self._count(MATH)
        return _math(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)

    def _count(self, backend: str) -> None:
        if not _UNCOUNTED.get():
            self.choices[backend] += 1

    def summary(self) -> list[str]:
        return [f"scaled_dot_product_attention ×{count}: CUDA's {backend} backend "
                f"(sdp_utils.cpp rules for cc {self.facts.compute_capability[0]}.{self.facts.compute_capability[1]})"
                for backend, count in sorted(self.choices.items())]


def _efficient_bias(mask, query, key):
    """The efficient kernel takes an additive float bias (attention.cpp): a boolean mask becomes one of
    its own shape (convert_boolean_attn_mask); preprocess_mask expands it to [B, H, L, S] and, when S
    is not a multiple of 16, pads it (pad_bias<16>), which materialises B·H·L·ceil16(S) elements."""
    if mask is None:
        return None
    if not mask.is_floating_point():
        mask = torch.zeros_like(mask, dtype=query.dtype).masked_fill_(mask.logical_not(), -math.inf)
    batch, heads, length, source = query.shape[0], query.shape[1], query.shape[2], key.shape[2]
    mask = mask.expand(batch, heads, length, source)
    if source % 16:
        mask = F.pad(mask, (0, 16 - source % 16))[..., :source]
    return mask


def _math(query, key, value, mask, dropout_p, is_causal, scale, gqa):
    """The math path: on CUDA, fp16/bf16 inputs are computed in fp32 unless fp16/bf16 reductions are
    allowed (attention.cpp _scaled_dot_product_attention_math, allowFP16BF16ReductionMathSDP)."""
    low = query.dtype in (torch.float16, torch.bfloat16)
    if low:
        original = query.dtype
        query, key, value = query.float(), key.float(), value.float()
        if mask is not None and mask.is_floating_point():
            mask = mask.float()
    if gqa and key.shape[-3] != query.shape[-3]:
        repeat = query.shape[-3] // key.shape[-3]
        key, value = key.repeat_interleave(repeat, -3), value.repeat_interleave(repeat, -3)
    out = torch.ops.aten._scaled_dot_product_attention_math(query, key, value, mask, dropout_p, is_causal,
                                                           None, scale=scale)[0]
    return out.to(original) if low else out


class _CompositeOverride:
    """A Python kernel for a CompositeImplicitAutograd op, registered on enter and removed on exit
    (the dispatcher then finds the C++ decomposition again)."""

    def __init__(self, op: str, kernel) -> None:
        self.op, self.kernel, self._library = op, kernel, None

    def __enter__(self) -> None:
        self._library = torch.library.Library("aten", "IMPL")
        with torch_private.quiet_kernel_override():
            self._library.impl(self.op, self.kernel, "CompositeImplicitAutograd")

    def __exit__(self, *exc) -> None:
        torch_private.destroy_library(self._library)


def cuda_dropout() -> _CompositeOverride:
    """For the length of a trace, aten::dropout decomposes as on CUDA. ATen's dropout (Dropout.cpp)
    takes the fused `native_dropout` kernel when is_fused_kernel_acceptable: a CUDA input, 0 < p < 1,
    numel > 0. It keeps a 1-byte bool mask for backward. The CPU path multiplies by a noise tensor in
    the input's dtype (bernoulli_, div_, mul), which keeps 4 bytes per element in fp32."""
    return _CompositeOverride("dropout", _cuda_dropout)


def _cuda_dropout(input, p, train):
    if not train or p == 0 or input.numel() == 0:
        return input  # _dropout_impl returns its input unchanged
    if p == 1:
        return input.mul(torch.zeros((), dtype=input.dtype))
    return torch.ops.aten.native_dropout(input, p, train)[0]
