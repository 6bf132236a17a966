"""A config.json's numbers, checked before transformers reads them (frontends/hf.py checked_config walks the
file and calls these for every object and key): whole numbers within int64, widths, vocabularies, head counts
and sizes, position limits and the batch's shapes positive, layer and expert counts within trainmem's limits,
and widths that split into whole heads. Each failure is one line naming the file and the key
(`…/config.json: num_hidden_layers`). The rotary-position settings are frontends/hf_rope.py's.
"""

from __future__ import annotations

from typing import Any

from trainmem.errors import ModelRefError
from trainmem.frontends.hf_hub import clip_text
from trainmem.frontends.hf_rope import check_rope_number

# Layers per stack (num_hidden_layers, n_layer, encoder_layers, the sum of a Swin's depths …). Each layer is
# built and traced: measured, a 100-layer llama (hidden 16) takes 60 s of CPU and 570 MB of RSS to
# estimate (about 0.5 s and 2.2 MB a layer), so 100,000 layers would run for hours and grow without bound.
# The deepest released models have 126 (Llama-3.1-405B; PaLM 118, GPT-3 96), the bundled table at most 80:
# twice the deepest keeps them all and bounds an estimate near 2–3 minutes and 1 GB.
MAX_LAYERS = 256
# Experts per mixture-of-experts layer (num_local_experts, n_routed_experts, …): released models have at
# most 512 (Qwen3-Next), DeepSeek-V3 256; some implementations build one module per expert.
MAX_EXPERTS = 4096
# Widths, vocabularies, head counts and sizes, position limits and the batch's shapes (read by hf.py's _batch_maker):
# each a positive whole number (transformers divides by some and sizes tensors by all; 0 fails as a division
# by zero, head_dim 0 as 0.0 raised to a negative power in the rotary embedding, "wide" deep inside a layer's
# constructor, a negative position limit as a sequence length below 1).
SIZE_KEYS = frozenset(("hidden_size", "intermediate_size", "vocab_size", "n_embd", "d_model", "d_ff",
                       "num_attention_heads", "num_key_value_heads", "n_head", "num_heads", "encoder_attention_heads",
                       "decoder_attention_heads", "encoder_ffn_dim", "decoder_ffn_dim",
                       "head_dim", "d_kv", "kv_channels", "attention_head_size",
                       "max_position_embeddings", "n_positions", "max_target_positions", "max_source_positions",
                       "num_mel_bins", "num_channels", "image_size"))
INT64_MAX = 2**63 - 1  # every number becomes a tensor size or an index somewhere: beyond int64 is not a model


def check_number(key: str, value: Any, key_path: str, where: str) -> None:
    """One key's value (`key` lowercased, `key_path` its place in the file): within int64, a positive size where
    SIZE_KEYS names it, a rope number (hf_rope.py), a layer or expert count within MAX_LAYERS and MAX_EXPERTS."""
    if isinstance(value, bool):
        return
    if isinstance(value, int) and abs(value) > INT64_MAX:
        raise ModelRefError(f"expected whole numbers within int64, got {clip_text(str(value), 30)}",
                            where=f"{where}: {clip_text(key_path, 60)}")
    if key in SIZE_KEYS:
        _check_size(key, value, key_path, where)
    check_rope_number(key, value, key_path, where)
    # counts: num_hidden_layers, encoder_layers, n_layer …; not an index such as vision_feature_layer: -2
    is_layer_count = key.endswith("layers") or key in ("n_layer", "depth", "depths")
    counts = [value] if isinstance(value, int) else value if key == "depths" and isinstance(value, list) else []
    if is_layer_count and (isinstance(value, (float, str)) or any(not isinstance(count, int) or count < 0
                                                                  or isinstance(count, bool) for count in counts)):
        # a list of layer indices (mlp_only_layers, no_rope_layers …) is not a count and is not checked
        raise ModelRefError(f"expected a whole number of layers from 0 to {MAX_LAYERS}, got {clip_text(repr(value), 40)}",
                            where=f"{where}: {clip_text(key_path, 60)}")
    total = sum(counts)
    if is_layer_count and total > MAX_LAYERS:
        raise ModelRefError(f"expected at most {MAX_LAYERS:,} layers (trainmem's limit: the deepest released "
                            f"models have 126), got {total:,}", where=f"{where}: {clip_text(key_path, 60)}")
    if "experts" in key and isinstance(value, int) and value > MAX_EXPERTS:
        raise ModelRefError(f"expected at most {MAX_EXPERTS:,} experts (trainmem's limit: released models have at "
                            f"most 512), got {value:,}", where=f"{where}: {clip_text(key_path, 60)}")


def _check_size(key: str, value: Any, key_path: str, where: str) -> None:
    """A width, a vocabulary or a head count is a positive whole number (null: the model's default); a
    list of them, one per layer, holds positive whole numbers."""
    values = value if isinstance(value, list) else [value]
    if value is not None and not all(isinstance(item, int) and not isinstance(item, bool) and item > 0
                                     for item in values):
        raise ModelRefError(f"expected a positive whole number, got {clip_text(repr(value), 40)}",
                            where=f"{where}: {clip_text(key_path, 60)}")


def check_heads(config: dict[str, Any], path: str, where: str) -> None:
    """Attention splits the width into heads: without an explicit head size (head_dim, d_kv, kv_channels)
    the width must be a multiple of the head count, as transformers' attention layers require."""
    for width_key, heads_key in (("hidden_size", "num_attention_heads"), ("n_embd", "n_head"), ("d_model", "num_heads")):
        width, heads = config.get(width_key), config.get(heads_key)
        if (isinstance(width, int) and isinstance(heads, int) and heads > 0 and width % heads
                and not any(key in config for key in ("head_dim", "d_kv", "kv_channels", "attention_head_size"))):
            key_path = f"{path}.{width_key}" if path else width_key
            raise ModelRefError(f"expected a multiple of {heads_key} ({heads:,}), got {width:,}",
                                where=f"{where}: {clip_text(key_path, 60)}")
    # grouped-query attention shares each key/value head among a whole number of query heads
    heads, kv_heads = config.get("num_attention_heads"), config.get("num_key_value_heads")
    if isinstance(heads, int) and isinstance(kv_heads, int) and kv_heads > 0 and heads % kv_heads:
        key_path = f"{path}.num_key_value_heads" if path else "num_key_value_heads"
        raise ModelRefError(f"expected a divisor of num_attention_heads ({heads:,}), got {kv_heads:,}",
                            where=f"{where}: {clip_text(key_path, 60)}")


# bnb_4bit_compute_dtype as config.json saves it (BitsAndBytesConfig.to_dict: the dtype's name), as --bnb-compute-dtype
BNB_COMPUTE = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}


def quantization_summary(value: Any) -> str:
    """A checkpoint's quantization_config by its method (fp8, gptq, bitsandbytes …); for a bitsandbytes 4-bit one, the
    flags that estimate fine-tuning it as saved: QLoRA, its statistics and compute dtype (an absent compute dtype is
    BitsAndBytesConfig's default, fp32). FP4 is stored as NF4 is (packed values and an absmax per block)."""
    if not isinstance(value, dict):
        return clip_text(str(value), 40)
    method = clip_text(str(value.get("quant_method", "(a table)")), 40)
    if method != "bitsandbytes" or value.get("load_in_4bit") is not True:
        return method
    quant = "nf4-dq" if value.get("bnb_4bit_use_double_quant") is True else "nf4"
    compute = BNB_COMPUTE.get(str(value.get("bnb_4bit_compute_dtype", "float32")).removeprefix("torch."))
    flags = f"--qlora --bnb-quant {quant}" + (f" --bnb-compute-dtype {compute}" if compute else "")
    stored = " (its fp4 is stored as nf4 is)" if value.get("bnb_4bit_quant_type") == "fp4" else ""
    return f"bitsandbytes 4-bit (fine-tuning it is QLoRA: {flags}){stored}"
