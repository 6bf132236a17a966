"""Splitting a meta-built model into pipeline stages: contiguous pieces of an nn.Sequential, or a Llama-family
Hugging Face causal LM cut between decoder layers (stage 0 holds the embeddings, the last stage the final
norm, lm_head and the loss), each piece balanced by parameter count.

A stage is an nn.Module that calls the real submodules, and keeps their names ("model.layers.7.mlp",
"3"), so that a tensor-parallel plan and the per-module report read as for the whole model.
"""

from __future__ import annotations

import collections
from typing import Any

import torch
from torch import nn

from trainmem.errors import SetupError

# Hugging Face model types whose decoder layers take (hidden, attention_mask, position_embeddings,
# position_ids) and whose base model is embed_tokens -> layers -> norm with one rotary_emb, as LlamaModel.
# forward in transformers 5 (models/llama/modeling_llama.py) writes it; they differ only in the masks:
# Qwen2/Qwen3 give each layer the mask of its config.layer_types entry (full or sliding window), Mistral uses
# the sliding-window mask for every layer when config.sliding_window is set. Others are refused, not guessed.
LLAMA_FAMILY = ("llama", "mistral", "qwen2", "qwen3")


def _count(params: Any) -> int:
    return sum(p.numel() for p in {id(p): p for p in params}.values())


def balanced_cuts(weights: list[int], parts: int) -> list[tuple[int, int]]:
    """Contiguous [start, end) ranges, one per part, none empty, minimising the largest part's weight (the
    classic linear-partition dynamic programme). Ties go to the later cut, so a parameter-free layer (an
    activation) stays with the layer before it, as a hand-written split would put it."""
    n = len(weights)
    prefix = [0]
    for weight in weights:
        prefix.append(prefix[-1] + weight)
    inf = float("inf")
    best = [[inf] * (n + 1) for _ in range(parts + 1)]
    cut = [[0] * (n + 1) for _ in range(parts + 1)]
    best[0][0] = 0
    for k in range(1, parts + 1):
        for end in range(k, n - (parts - k) + 1):
            for start in range(k - 1, end):
                cost = max(best[k - 1][start], prefix[end] - prefix[start])
                if cost <= best[k][end]:
                    best[k][end], cut[k][end] = cost, start
    ranges, end = [], n
    for k in range(parts, 0, -1):
        ranges.append((cut[k][end], end))
        end = cut[k][end]
    return ranges[::-1]


# ---- nn.Sequential -----------------------------------------------------------------------------------------
def _sequential_stages(model: nn.Sequential, num_stages: int) -> list[nn.Module]:
    children = list(model.named_children())
    if len(children) < num_stages:
        raise SetupError(f"expected at least {num_stages} layers to split into {num_stages} pipeline stages, got "
                         f"{len(children)} in {type(model).__name__}", where="--pp")
    weights = [_count(child.parameters()) for _, child in children]
    stages = []
    for start, end in balanced_cuts(weights, num_stages):
        stages.append(nn.Sequential(collections.OrderedDict(children[start:end])))
    return stages


# ---- Llama-family causal LMs ------------------------------------------------------------------------------
class CausalLMStage(nn.Module):
    """One pipeline stage of a Llama-family causal LM, calling the real submodules as LlamaModel.forward and
    LlamaForCausalLM.forward do: embeddings (first stage), the stage's decoder layers with the causal mask
    and rotary position embeddings this stage computes for itself, final norm and lm_head (last stage)."""

    def __init__(self, full: nn.Module, layer_ids: range, first: bool, last: bool) -> None:
        super().__init__()
        base = full.model
        self.model = nn.Module()
        if first:
            self.model.embed_tokens = base.embed_tokens
        # a ModuleList (so --checkpointing finds the decoder layers as blocks, trace/checkpointing.py) whose
        # entries keep the model's layer numbers as names: "model.layers.7" is layer 7 on whichever stage
        self.model.layers = nn.ModuleList()
        for i in layer_ids:
            self.model.layers.add_module(str(i), base.layers[i])
        if last:
            self.model.norm = base.norm
        self.model.rotary_emb = base.rotary_emb  # buffers only (inv_freq); each stage holds its copy
        if last:
            self.lm_head = full.lm_head
        self.config = full.config
        self.first, self.last = first, last
        plan = getattr(full, "tp_plan", None)
        self.tp_plan = dict(plan) if isinstance(plan, dict) else {}  # same names: the model's own plan applies
        self._loss_function = full.loss_function

    def fsdp_blocks(self) -> list[nn.Module]:
        """The decoder layers, FSDP's units under --fsdp-wrap auto/blocks however few a stage holds (one layer is
        no repeated block, and the fallback's top-level child `self.model` is a holder of names whose forward
        never runs, so its hooks would never all-gather the embedding inside it)."""
        return list(self.model.layers)

    def fsdp_children(self) -> list[nn.Module]:
        """What this stage's forward calls itself, the units of --fsdp-wrap children."""
        first = [self.model.embed_tokens] if self.first else []
        last = [self.model.norm, self.lm_head] if self.last else []
        return [*first, *self.model.layers, *last]

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.first:
            hidden = self.model.embed_tokens(hidden)
        position_ids = torch.arange(hidden.shape[1], device=hidden.device).unsqueeze(0)
        masks = self._masks(hidden, position_ids)
        position_embeddings = self.model.rotary_emb(hidden, position_ids=position_ids)
        for index, layer in self.model.layers.named_children():
            hidden = layer(hidden, attention_mask=masks[self._layer_type(int(index))],
                           position_embeddings=position_embeddings, position_ids=position_ids)
        if self.last:
            hidden = self.lm_head(self.model.norm(hidden))
        return hidden

    def _layer_type(self, index: int) -> str:
        if getattr(self.config, "model_type", "") in ("qwen2", "qwen3"):
            return self.config.layer_types[index]
        if getattr(self.config, "model_type", "") == "mistral" and self.config.sliding_window is not None:
            return "sliding_attention"
        return "full_attention"

    def _masks(self, hidden: torch.Tensor, position_ids: torch.Tensor) -> dict[str, Any]:
        """The masks this stage's layers read, made as the model's forward makes them (masking_utils)."""
        from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask

        makers = {"full_attention": create_causal_mask, "sliding_attention": create_sliding_window_causal_mask}
        # on meta (pp_run's pass for the stage boundaries' shapes) the packed-sequence check that position_ids
        # trigger would read values; shapes do not depend on it. Under fake tensors transformers skips it itself.
        ids = None if hidden.device.type == "meta" else position_ids
        kinds = {self._layer_type(int(index)) for index, _ in self.model.layers.named_children()}
        return {kind: makers[kind](config=self.config, inputs_embeds=hidden, attention_mask=None, cache=None,
                                   position_ids=ids) for kind in kinds}

    def pipeline_loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """The loss LlamaForCausalLM.forward computes from `labels` (ForCausalLMLoss: shift, upcast, cross-entropy)."""
        return self._loss_function(logits=logits, labels=labels, vocab_size=self.config.vocab_size)


def is_llama_family(model: nn.Module) -> bool:
    config = getattr(model, "config", None)
    base = getattr(model, "model", None)
    return (getattr(config, "model_type", None) in LLAMA_FAMILY and isinstance(getattr(model, "lm_head", None), nn.Linear)
            and all(hasattr(base, name) for name in ("embed_tokens", "layers", "norm", "rotary_emb")))


def _causal_lm_units(model: nn.Module) -> list[int]:
    """Parameter counts of the units a cut may fall between: embeddings, each decoder layer, norm + lm_head."""
    base = model.model
    layers = [_count(layer.parameters()) for layer in base.layers]
    head = _count([*base.norm.parameters(), *model.lm_head.parameters()])
    return [_count(base.embed_tokens.parameters()), *layers, head]


def _causal_lm_stages(model: nn.Module, num_stages: int) -> list[nn.Module]:
    units = _causal_lm_units(model)
    if len(units) < num_stages:
        raise SetupError(f"expected at least {num_stages - 2} decoder layers for {num_stages} pipeline stages, got "
                         f"{len(units) - 2}", where="--pp")
    stages = []
    for start, end in balanced_cuts(units, num_stages):
        first, last = start == 0, end == len(units)
        layer_ids = range(max(start - 1, 0), min(end - 1, len(units) - 2))  # unit i is decoder layer i - 1
        stages.append(CausalLMStage(model, layer_ids, first, last))
    return stages


def split_stages(model: nn.Module, num_stages: int) -> list[nn.Module]:
    """The model's stages, in order, on whatever device it is built on (meta here); refuses other models."""
    if isinstance(model, nn.Sequential):
        return _sequential_stages(model, num_stages)
    if is_llama_family(model):
        return _causal_lm_stages(model, num_stages)
    raise SetupError(f"expected an nn.Sequential or a Llama-family Hugging Face causal LM ({', '.join(LLAMA_FAMILY)}) "
                     f"to split into pipeline stages, got {type(model).__name__}", where="--pp")


def stage_parameter_counts(model: nn.Module, layout: Any) -> list[int]:
    """Parameters each pipeline stage holds (before tensor parallelism), in stage order: `layout.pp` stages,
    times `stages_per_rank` for interleaved 1F1B."""
    return [_count(stage.parameters()) for stage in split_stages(model, total_stages(layout))]


def total_stages(layout: Any) -> int:
    virtual = layout.stages_per_rank if str(layout.schedule) == "interleaved-1f1b" else 1
    return layout.pp * virtual
