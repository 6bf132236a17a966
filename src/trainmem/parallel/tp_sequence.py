"""Sequence parallelism for Llama-family tensor parallelism, as torchtitan's default llama3 plan writes it
(torchtitan/models/llama3/infra/parallelize.py apply_tp, enable_sequence_parallel on by default with TP):
the residual stream between the blocks is sharded on the sequence (Shard(1)), the norms run on each rank's
sequence slice (SequenceParallel), the attention and MLP inputs are all-gathered (PrepareModuleInput
Shard(1) -> Replicate), o_proj/down_proj reduce-scatter back to Shard(1) (RowwiseParallel output Shard(1)),
the embedding's output is reduce-scattered (RowwiseParallel output Shard(1)) and the output projection
all-gathers its input (ColwiseParallel input Shard(1)), its logits Replicate (no loss parallelism).

One difference from torchtitan, for Hugging Face's code: torchtitan hands local tensors between the blocks;
Hugging Face's LlamaModel.forward derives the positions (cache_position, rotary cos/sin, the causal mask) from
`inputs_embeds.shape[1]`, which must be the whole sequence, so the residual stream stays a DTensor
(use_local_output=False): the same local shards (1/tp of the sequence per rank), only the wrapper differs.
Only for a whole model (no pipeline stages: a stage's output goes to torch.distributed.pipelining's P2P as a
plain tensor) whose plan is the Llama projections; anything else keeps the plan without it.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from trainmem.parallel.pp_split import is_llama_family

_COLWISE = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")
_ROWWISE = ("o_proj", "down_proj")


def sequence_parallel_styles(model: nn.Module, plan: dict[str, str]) -> dict[str, Any] | None:
    """torch styles for `plan` (module -> Hugging Face style) with sequence parallelism, or None when the model
    or the plan is not the Llama shape this is written for."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel,
                                                   SequenceParallel)

    if not is_llama_family(model):
        return None
    styles: dict[str, Any] = {}
    for name, style in plan.items():
        leaf = name.rpartition(".")[2]
        if leaf == "embed_tokens" and style == "embedding_rowwise":
            styles[name] = RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1), use_local_output=False)
        elif leaf == "lm_head" and style == "colwise_gather_output":
            styles[name] = ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate())
        elif leaf in _COLWISE and style == "colwise":
            styles[name] = ColwiseParallel()
        elif leaf in _ROWWISE and style == "rowwise":
            styles[name] = RowwiseParallel(output_layouts=Shard(1), use_local_output=False)
        elif style == "replicated_with_grad_allreduce":  # inside the attention, on its local heads
            from trainmem.parallel.tp import tp_styles

            styles[name] = tp_styles()[style]()
        else:
            return None
    if not {"model.embed_tokens", "lm_head"} <= set(styles):
        return None
    styles["model.norm"] = SequenceParallel()
    for index in range(len(model.model.layers)):
        layer = f"model.layers.{index}"
        styles[f"{layer}.input_layernorm"] = SequenceParallel()
        styles[f"{layer}.post_attention_layernorm"] = SequenceParallel()
        # the decoder layer calls self_attn(hidden_states=...) by keyword and mlp(hidden_states) by position
        styles[f"{layer}.self_attn"] = PrepareModuleInput(
            input_kwarg_layouts={"hidden_states": Shard(1)}, desired_input_kwarg_layouts={"hidden_states": Replicate()},
            use_local_output=True)
        styles[f"{layer}.mlp"] = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),),
                                                    use_local_output=True)
    return styles
