"""The published formulas for per-GPU training memory, computed beside the traced result and each difference
explained. trainmem never computes its estimate with these; they are what a reader already knows, so the report
shows where the real code of the real model departs from them. No torch here.

Sources (each formula below names its own):
- ZeRO: Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training Trillion Parameter Models"
  (arXiv 1910.02054), section 5 and Figure 1: mixed-precision Adam keeps 2Ψ (fp16 parameters) + 2Ψ (fp16
  gradients) + KΨ optimizer state with K = 12 (fp32 master parameters, momentum, variance); over N data-parallel
  ranks P_os keeps 4Ψ + KΨ/N, P_os+g 2Ψ + (2+K)Ψ/N, P_os+g+p (2+2+K)Ψ/N.
- DeepSpeed: deepspeed/runtime/zero/stage_1_and_2.py `estimate_zero2_model_states_mem_needs` and
  deepspeed/runtime/zero/stage3.py `estimate_zero3_model_states_mem_needs` (deepspeedai/DeepSpeed, read at
  commits 02aa38c3 and 007cca6a).
- Activations: Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models"
  (arXiv 2205.05198), Table 2 (bytes per transformer layer, 16-bit activations, 1-byte dropout masks); the input
  and output terms as Megatron-LM's megatron/training/theoretical_memory_usage.py `compute_activation_memory`
  adds them ("Using formula in Table 2 of https://arxiv.org/pdf/2205.05198.pdf").
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from trainmem.setup.layout import ParallelLayout, Strategy

ADAM_K = 12  # ZeRO section 5.1: fp32 parameters, momentum and variance, 4 + 4 + 4 bytes per parameter
RECOMPUTE = ("none", "selective", "full")


@dataclasses.dataclass(frozen=True)
class CrossCheck:
    name: str
    formula_bytes: int
    traced_bytes: int | None  # the traced figure it is compared with (None: nothing traced to compare)
    explanation: str

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# ---- ZeRO (Rajbhandari et al. 2020) --------------------------------------------------------------------------

def zero_model_states(psi: int, n: int, stage: int, k: int = ADAM_K) -> int:
    """Per-rank model-state bytes of ZeRO's Figure 1: stage 0 (plain data parallel) (2+2+K)Ψ, 1 (P_os)
    4Ψ + KΨ/N, 2 (P_os+g) 2Ψ + (2+K)Ψ/N, 3 (P_os+g+p) (2+2+K)Ψ/N. Rounded up to whole bytes."""
    if stage not in (0, 1, 2, 3) or n < 1 or psi < 0:
        raise ValueError(f"expected stage 0-3, n >= 1, psi >= 0, got stage {stage}, n {n}, psi {psi}")
    replicated = {0: (4 + k) * psi, 1: 4 * psi, 2: 2 * psi, 3: 0}[stage]
    sharded = {0: 0, 1: k * psi, 2: (2 + k) * psi, 3: (4 + k) * psi}[stage]
    return replicated + math.ceil(sharded / n)


# ---- DeepSpeed's estimators (verbatim arithmetic, bytes) --------------------------------------------------------

def deepspeed_zero2_model_states(total_params: int, num_gpus_per_node: int = 1, num_nodes: int = 1,
                                 cpu_offload: bool = True, additional_buffer_factor: float = 1.5) -> tuple[int, int]:
    """(cpu_bytes, gpu_bytes) as deepspeed/runtime/zero/stage_1_and_2.py estimate_zero2_model_states_mem_needs
    computes them. Its comment: 2 = params_16bit; 18 = 2 grads_16bit + 4 grads_32bit + 4 params_32bit + 8 optimizer
    states. (Older DeepSpeed releases used 4Ψ + 16Ψ/N here; the current source has 2Ψ + 18Ψ/N.)"""
    total_gpus = num_nodes * num_gpus_per_node
    if cpu_offload:
        gpu_mem = 2 * total_params
        cpu_mem = total_params * max(4 * total_gpus, 16) * additional_buffer_factor
    else:
        gpu_mem = 2 * total_params + int(18 * total_params / total_gpus)
        cpu_mem = total_params * 4 * num_gpus_per_node * additional_buffer_factor
    return int(cpu_mem), int(gpu_mem)


def deepspeed_zero3_model_states(total_params: int, largest_layer_params: int, num_gpus_per_node: int = 1,
                                 num_nodes: int = 1, cpu_offload: bool = True, cpu_offload_params: bool = True,
                                 zero_init: bool = True, additional_buffer_factor: float = 1.5) -> tuple[int, int, int]:
    """(cpu_bytes, gpu_bytes, largest_layer_bytes) as deepspeed/runtime/zero/stage3.py
    estimate_zero3_model_states_mem_needs computes them (largest layer: 4 bytes per parameter, its fp16 parameters
    and gradients gathered whole)."""
    total_gpus = num_nodes * num_gpus_per_node
    gpus_factor = 1 / num_nodes
    largest_layer_memory = 4 * largest_layer_params
    if cpu_offload:
        per_param = 18 if cpu_offload_params else 16
        gpu_mem = largest_layer_memory
        if not cpu_offload_params:
            gpu_mem += int(2 * total_params / total_gpus)
        factor = per_param * gpus_factor if zero_init else max(4 * num_gpus_per_node, per_param * gpus_factor)
        cpu_mem = total_params * factor * additional_buffer_factor
    else:
        gpu_mem = largest_layer_memory + int(18 * total_params / total_gpus)
        cpu_params = largest_layer_params if zero_init else total_params
        cpu_mem = cpu_params * 4 * num_gpus_per_node * additional_buffer_factor
    return int(cpu_mem), int(gpu_mem), largest_layer_memory


# ---- Activations (Korthikanti et al. 2022, Table 2) -------------------------------------------------------------

def activation_bytes_per_layer(s: int, b: int, h: int, a: int, t: int = 1, sequence_parallel: bool = False,
                               recompute: str = "none") -> int:
    """Bytes one transformer layer keeps for backward, Table 2 of arXiv 2205.05198 (16-bit activations, 1-byte
    dropout masks, attention that stores its a·s² scores, softmax output and dropout mask):
      no parallelism                  sbh(34 + 5as/h)
      tensor parallel                 sbh(10 + 24/t + 5as/(ht))
      tensor + sequence parallel      sbh/t · (34 + 5as/h)
      selective recomputation         sbh(10 + 24/t) (TP), sbh·34/t (TP + SP)
      full recomputation              2sbh (the layer's input only); with sequence parallelism that input is
                                      itself split over the t ranks, 2sbh/t (the table gives the unsplit 2sbh)."""
    if recompute not in RECOMPUTE:
        raise ValueError(f"expected recompute in {RECOMPUTE}, got {recompute!r}")
    sbh = s * b * h
    if recompute == "full":
        return math.ceil(2 * sbh / t) if sequence_parallel else 2 * sbh
    attention = 0.0 if recompute == "selective" else 5 * a * s / (h * t)
    if sequence_parallel:
        return math.ceil(sbh * (34 / t + attention))
    return math.ceil(sbh * (10 + 24 / t + attention))


def megatron_activation_bytes(s: int, b: int, h: int, layers: int, vocab: int, t: int = 1, p: int = 1,
                              microbatches: int | None = None, per_layer: int | None = None,
                              virtual: int | None = None) -> int:
    """The first pipeline stage's activation bytes as Megatron-LM's compute_activation_memory adds them up:
    `per_layer` × layers (the whole model's layers: with 1F1B the first stage keeps p micro-batches of L/p layers),
    + 8sbp (the int64 token ids of p micro-batches in flight) + sbhp (the embedding dropout mask), scaled by
    min(1, m/p) when fewer micro-batches than stages (non-interleaved), or by the interleaved schedule's
    1 + (p - 1)/(p·virtual) with `virtual` model chunks a rank, + 4sbh(1 + v/h) (final norm output and fp32
    logits for the cross-entropy) when p == 1; all divided by t (tensor and sequence parallelism split each term)."""
    if per_layer is None:
        per_layer = activation_bytes_per_layer(s, b, h, 1, t=1, sequence_parallel=True, recompute="selective")
    total = per_layer * t * layers  # per_layer is already per rank (/t); Megatron divides once at the end
    total += 8 * s * b * p + s * b * h * p
    if virtual is not None:
        total *= 1 + (p - 1) / (p * virtual)
    elif p > 1 and microbatches is not None:
        total *= min(1.0, microbatches / p)
    if p == 1:
        total += s * b * h * 4 * (1 + vocab / h)
    return math.ceil(total / t)


# ---- Cross-checks beside a traced estimate ----------------------------------------------------------------------

def model_config_from_hf(config: Any, seq_len: int) -> dict[str, int]:
    """The shape numbers the activation formula needs, from a transformers PretrainedConfig."""
    h = config.hidden_size
    out = {"hidden_size": h, "num_attention_heads": config.num_attention_heads,
           "num_hidden_layers": config.num_hidden_layers, "seq_len": seq_len, "vocab_size": config.vocab_size,
           "intermediate_size": getattr(config, "intermediate_size", None) or 4 * h}
    out["largest_layer_params"] = max(out["vocab_size"] * h, h * out["intermediate_size"])
    return out


def _zero_stage(layout: ParallelLayout) -> tuple[int, int, str]:
    """(ZeRO stage, N, what it stands for) for the layout's data-parallel kind."""
    kind = layout.data_parallel
    if kind in (None, Strategy.DDP):
        return 0, max(layout.dp, 1), "plain data parallelism (every rank a full replica)"
    if kind == Strategy.ZERO1:
        return 1, layout.dp, "P_os (optimizer state sharded)"
    if kind == Strategy.ZERO2:
        return 2, layout.dp, "P_os+g (optimizer state and gradients sharded)"
    if kind == Strategy.FSDP1:
        return _fsdp1_stage(layout)
    if kind == Strategy.HSDP:
        return 3, layout.hsdp_shard, (f"P_os+g+p over the {layout.hsdp_shard} ranks that shard "
                                      "(HSDP replicates across the rest)")
    return 3, layout.dp, "P_os+g+p (everything sharded, FSDP2 fully_shard)"


def _fsdp1_stage(layout: ParallelLayout) -> tuple[int, int, str]:
    """FSDP1's sharding strategies as ZeRO stages: FULL_SHARD is 3, SHARD_GRAD_OP 2 (its parameters are sharded
    too between steps, but gathered from forward through backward), NO_SHARD 0."""
    from trainmem.setup.layout import Fsdp1Sharding

    if layout.fsdp1_sharding == Fsdp1Sharding.NO_SHARD:
        return 0, layout.dp, "FSDP1 NO_SHARD (every rank a full replica)"
    if layout.fsdp1_sharding == Fsdp1Sharding.HYBRID_SHARD:
        return 3, layout.hsdp_shard, f"P_os+g+p over the {layout.hsdp_shard} ranks that shard (FSDP1 HYBRID_SHARD)"
    if layout.fsdp1_sharding == Fsdp1Sharding.SHARD_GRAD_OP:
        return 2, layout.dp, "P_os+g (FSDP1 SHARD_GRAD_OP: parameters gathered from forward through backward)"
    return 3, layout.dp, "P_os+g+p (everything sharded, FSDP1 FULL_SHARD)"


def _precision_note(precision: str, optimizer: str) -> str:
    adam = optimizer in ("adam", "adamw")
    state = "Adam keeps two fp32 moments (8 bytes a parameter)" if adam else \
        f"{optimizer} keeps its own state, not Adam's 12 bytes"
    if precision == "bf16-mixed" or precision == "fp16-mixed":
        return (f"ZeRO's 2+2+K assumes fp16 parameters and gradients plus an fp32 master copy; a torch {precision} "
                f"run keeps fp32 parameters and fp32 gradients (4 + 4 bytes) and no master copy, and {state}: "
                "16 bytes a parameter by another split; autocast's low-precision weight copies live among the "
                "activations/temporaries instead")
    if precision == "bf16":
        return f"pure bf16: parameters and gradients 2 bytes each, {state} in bf16 too, no master copy"
    return f"fp32: parameters 4 and gradients 4 bytes, {state}; no fp16 copy, no master copy"


def _model_states(breakdown: dict[str, int]) -> int:
    return sum(int(breakdown.get(key, 0) or 0) for key in ("parameters", "gradients", "optimizer_state"))


def _zero_check(est: dict[str, Any], layout: ParallelLayout) -> CrossCheck:
    psi_total = int(est["model"]["parameters"])
    shard = layout.tp * layout.pp
    psi = math.ceil(psi_total / shard)
    stage, n, meaning = _zero_stage(layout)
    setup = est.get("setup", {})
    formula = zero_model_states(psi, n, stage)
    offload = str(layout.offload)
    if offload == "optimizer":  # ZeRO-Offload: the K bytes of optimizer state live in host RAM
        formula -= math.ceil(ADAM_K * psi / n)
    elif offload == "params":  # parameters, gradients and optimizer state all in host RAM (FSDP2 CPUOffloadPolicy)
        formula = 0
    split = f"Ψ = {psi_total:,} parameters" + (f" / (tp {layout.tp} × pp {layout.pp}) = {psi:,} a model-parallel "
                                                 "shard (even split assumed)" if shard > 1 else "")
    moved = {"optimizer": " With --offload optimizer the KΨ/N optimizer share is in host RAM (ZeRO-Offload).",
             "params": " With --offload params every model state is in host RAM: only gathered layers are on the GPU."
             }.get(offload, "")
    explanation = (f"ZeRO stage {stage}, {meaning}, N = {n}, K = 12; {split}.{moved} "
                   f"{_precision_note(str(setup.get('precision')), str(setup.get('optimizer')))}. The traced figure "
                   "is parameters + gradients + optimizer state at this rank's peak: gradients not yet produced or "
                   "already freed there are absent, and FSDP's all-gathered (unsharded) layers count as parameters.")
    return CrossCheck("ZeRO model states (Rajbhandari et al. 2020, Figure 1)", formula,
                      _model_states(est.get("breakdown", {})), explanation)


def _deepspeed_check(est: dict[str, Any], layout: ParallelLayout, config: dict | None) -> CrossCheck | None:
    kind = layout.data_parallel
    if kind not in (Strategy.ZERO1, Strategy.ZERO2, Strategy.ZERO3, Strategy.FSDP, Strategy.HSDP):
        return None
    psi = math.ceil(int(est["model"]["parameters"]) / (layout.tp * layout.pp))
    n = layout.hsdp_shard if kind == Strategy.HSDP else layout.dp
    per_node = min(n, layout.gpus_per_node)
    nodes = math.ceil(n / per_node)
    traced = _model_states(est.get("breakdown", {}))
    offload = str(layout.offload)
    if kind in (Strategy.ZERO1, Strategy.ZERO2):
        _, gpu = deepspeed_zero2_model_states(psi, per_node, nodes, cpu_offload=offload != "none")
        return CrossCheck("DeepSpeed estimate_zero2_model_states_mem_needs (GPU)", gpu, traced,
                          f"{per_node} GPUs a node × {nodes} nodes, offload_optimizer={offload != 'none'}: "
                          "2Ψ fp16 parameters + 18Ψ/N (fp16 and fp32 gradients, fp32 parameters, Adam's two "
                          "moments); "
                          "DeepSpeed has no ZeRO-1 estimator, so zero1 is compared with ZeRO-2's. A torch run has no "
                          "fp16 copies, and ZeRO-1 keeps full gradients on every rank." + _tail())
    largest = int((config or {}).get("largest_layer_params") or 0)
    if not largest:
        return None
    _, gpu, layer = deepspeed_zero3_model_states(psi, largest, per_node, nodes, cpu_offload=offload != "none",
                                                 cpu_offload_params=offload == "params")
    return CrossCheck("DeepSpeed estimate_zero3_model_states_mem_needs (GPU)", gpu, traced,
                      f"{per_node} GPUs a node × {nodes} nodes, offload={offload}: 4 bytes × the largest layer "
                      f"({largest:,} parameters, {layer:,} B gathered whole) + 18Ψ/N. FSDP2 gathers a whole wrapped "
                      "block (all its layers) at a time and prefetches the next, so its unsharded peak is one to two "
                      "blocks, not one layer." + _tail())


def _tail() -> str:
    return " The traced figure is parameters + gradients + optimizer state at this rank's peak."


def _recompute(setup: dict[str, Any]) -> str:
    return "full" if setup.get("checkpointing") else "none"


def _activation_check(est: dict[str, Any], layout: ParallelLayout, config: dict) -> CrossCheck:
    setup = est.get("setup", {})
    s, h, a = int(config["seq_len"]), int(config["hidden_size"]), int(config["num_attention_heads"])
    layers, vocab = int(config["num_hidden_layers"]), int(config["vocab_size"])
    m = layout.microbatches or 1
    b = max(1, int(setup.get("batch_size") or 1) // m) if layout.pp > 1 else int(setup.get("batch_size") or 1)
    recompute = _recompute(setup)
    per_layer = activation_bytes_per_layer(s, b, h, a, t=layout.tp, sequence_parallel=False, recompute=recompute)
    # Megatron's sum is 1F1B's first stage: p micro-batches of L/p layers in flight (m/p of that when m < p).
    stage_layers = math.ceil(layers / layout.pp) * layout.pp
    interleaved = layout.pp > 1 and str(layout.schedule) == "interleaved-1f1b"
    total = megatron_activation_bytes(s, b, h, stage_layers, vocab, t=layout.tp, p=layout.pp,
                                      microbatches=m if layout.pp > 1 else None, per_layer=per_layer,
                                      virtual=layout.stages_per_rank if interleaved else None)
    if layout.pp > 1 and str(layout.schedule) == "gpipe" and m > layout.pp:
        total = total * m // layout.pp  # GPipe runs every forward before any backward: all m micro-batches live
    explanation = (f"s={s}, b={b} a micro-batch, h={h}, a={a}, t={layout.tp}, p={layout.pp}, m={m}, "
                   f"{layout.schedule if layout.pp > 1 else 'no pipeline'}, recompute={recompute}: "
                   "sbh(10 + 24/t + 5as/(ht)) a layer"
                   + (" (full recomputation keeps 2sbh)" if recompute == "full" else "")
                   + ", plus Megatron's input/output terms (token ids, embedding dropout mask, final norm and fp32 "
                   "logits 4sbh(1 + v/h)). The formula assumes 16-bit activations, 1-byte dropout masks, GELU with a "
                   "4h "
                   "MLP and attention that stores its a·s² scores; torch's SDPA/flash attention saves only a "
                   "logsumexp (no 5as/h term), Llama-style models have no dropout, SwiGLU MLPs and RMSNorm, an fp32 "
                   "run keeps 4-byte activations, and torch TP without SequenceParallel keeps norms and residuals "
                   "whole. Full recomputation also re-creates one layer's activations during backward, which 2sbh "
                   "leaves out. The traced figure is what this model's ops really save, at this rank's peak (part "
                   "may already be freed by backward there).")
    return CrossCheck("Activations (Korthikanti et al. 2022, Table 2)", total,
                      int(est.get("breakdown", {}).get("activations", 0) or 0), explanation)


def cross_checks(est_like: dict[str, Any], layout: ParallelLayout, model_config: dict | None) -> list[CrossCheck]:
    """The formulas for this estimate's layout: ZeRO's model states, DeepSpeed's estimator where the strategy is a
    sharded one, and (with a transformer's model_config) the activation formula. `est_like` is an Estimate's
    to_dict() (model.parameters, setup, breakdown)."""
    layout = layout.resolve()
    checks = [_zero_check(est_like, layout)]
    deepspeed = _deepspeed_check(est_like, layout, model_config)
    if deepspeed is not None:
        checks.append(deepspeed)
    needed = ("seq_len", "hidden_size", "num_attention_heads", "num_hidden_layers", "vocab_size")
    if model_config and all(model_config.get(key) for key in needed):
        checks.append(_activation_check(est_like, layout, model_config))
    return checks
