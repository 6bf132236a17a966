"""Memory-saving optimizers that torch does not ship, written to allocate what the real ones allocate.

* Lion (Chen et al. 2023, "Symbolic Discovery of Optimization Algorithms"), as the widely used PyTorch
  implementation lion-pytorch (lucidrains, lion_pytorch/lion_pytorch.py `update_fn`) computes it: one
  state buffer (exp_avg); the update is `exp_avg.clone().mul_(beta1).add(grad, alpha=1-beta1).sign_()`,
  two parameter-sized temporaries for the parameter being updated.
* 8-bit AdamW and its paged variant, as bitsandbytes lays out their state (bitsandbytes/optim/optimizer.py
  Optimizer2State.init_state): a parameter with fewer than `min_8bit_size` elements keeps two fp32
  states; a larger one keeps two uint8 states (one byte per element) and one fp32 absmax per block of
  BLOCKSIZE elements for each, plus the shared 256-entry quantization maps. The update is one fused
  kernel (optimizer_update_8bit_blockwise) that works in place: no temporaries.
  The paged variant allocates states of large parameters in CUDA managed memory (bitsandbytes
  functional.get_paged → cudaMallocManaged), outside PyTorch's caching allocator; the trace marks them
  so the CUDA target keeps them out of allocated/reserved. PagedAdamW (optim_bits=32, LitGPT's optimizer
  under --quantize bnb.*: litgpt/utils.py instantiate_bnb_optimizer) keeps two fp32 states for every
  parameter, paged the same way; its update (optimizer_update_32bit) also works in place.
"""

from __future__ import annotations

import torch

BLOCKSIZE = 256  # bitsandbytes Optimizer2State: blockwise quantization, 256 elements per absmax
MIN_8BIT_SIZE = 4096  # bitsandbytes Optimizer8bit default min_8bit_size
PAGED_MIN_NUMEL = 100_000  # bitsandbytes get_state_buffer: smaller states stay ordinary device tensors
QMAP_ENTRIES = 256


class Lion(torch.optim.Optimizer):
    def __init__(self, params, lr: float = 1e-4, betas=(0.9, 0.99), weight_decay: float = 0.0) -> None:
        super().__init__(params, {"lr": lr, "betas": betas, "weight_decay": weight_decay})

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["exp_avg"] = torch.zeros_like(p)
                exp_avg = state["exp_avg"]
                p.mul_(1 - group["lr"] * group["weight_decay"])
                update = exp_avg.clone().mul_(beta1).add(p.grad, alpha=1 - beta1).sign_()
                p.add_(update, alpha=-group["lr"])
                exp_avg.mul_(beta2).add_(p.grad, alpha=1 - beta2)
        return None


class AdamW8bit(torch.optim.Optimizer):
    """bitsandbytes AdamW8bit's state; `paged=True` is PagedAdamW8bit; `bits=32` with `paged=True` is PagedAdamW."""

    def __init__(self, params, lr: float = 1e-3, paged: bool = False, bits: int = 8) -> None:
        super().__init__(params, {"lr": lr})
        self.paged, self.bits = paged, bits
        self.paged_tensors: list[torch.Tensor] = []  # read by the trace: outside the caching allocator
        self._qmaps: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}

    def _buffer(self, p: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        buffer = torch.zeros_like(p, dtype=dtype)
        if self.paged and p.numel() >= PAGED_MIN_NUMEL:
            self.paged_tensors.append(buffer)
        return buffer

    def _init_state(self, p: torch.Tensor) -> dict:
        if p.numel() < MIN_8BIT_SIZE or self.bits == 32:
            return {"state1": self._buffer(p, torch.float32), "state2": self._buffer(p, torch.float32)}
        if p.device not in self._qmaps:  # one dynamic and one unsigned-dynamic map, shared by all parameters
            self._qmaps[p.device] = (torch.zeros(QMAP_ENTRIES, device=p.device), torch.zeros(QMAP_ENTRIES, device=p.device))
        blocks = -(-p.numel() // BLOCKSIZE)
        qmap1, qmap2 = self._qmaps[p.device]
        return {"state1": self._buffer(p, torch.uint8), "state2": self._buffer(p, torch.uint8),
                "absmax1": torch.zeros(blocks, device=p.device), "absmax2": torch.zeros(blocks, device=p.device),
                "qmap1": qmap1, "qmap2": qmap2}

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                if not self.state[p]:
                    self.state[p].update(self._init_state(p))
                # the fused kernel updates state and parameter in place; nothing else is allocated
        return None
