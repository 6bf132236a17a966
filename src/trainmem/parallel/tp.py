"""Tensor parallelism: torch's DTensor `parallelize_module` with ColwiseParallel / RowwiseParallel on the
meta-built model, before it is materialized, so each rank's parameters are its local shards.

Which modules are split, in this order of preference:
1. the model's own Hugging Face plan (`model.tp_plan` in transformers 5: the class's `_tp_plan` merged with
   `config.base_model_tp_plan`, keys like "model.layers.*.self_attn.q_proj"), its style names mapped onto
   torch's styles with the layouts transformers registers for them (transformers/distributed/
   tensor_parallel.py, the ALL_PARALLEL_STYLES.register calls: "colwise" = Colwise(Replicate -> Shard(-1)),
   "rowwise" = Rowwise(Shard(-1) -> Replicate), "colwise_gather_output" = Colwise(-> Replicate),
   "embedding_rowwise" = the vocabulary-sharded embedding, torch's Rowwise on nn.Embedding with a
   replicated input, as torchtitan's llama3 parallelize.py writes it);
2. Llama-family names (q/k/v/gate/up_proj column-wise, o_proj/down_proj row-wise), Megatron's split;
3. consecutive nn.Linear pairs inside an nn.Sequential (column-wise, then row-wise: the hidden activation
   stays sharded between them and one all-reduce ends the pair), for `mlp:` and layer-spec models.
Anything that does not divide by the tensor-parallel degree is refused with the module and dimension named;
a model none of these plans covers is refused.

Attention: Hugging Face attention reshapes its projections with view(..., -1, head_dim), so a column-wise
q/k/v shard is read as heads/tp local heads; the head counts themselves must divide by tp (checked). Logits:
a Hugging Face plan's lm_head "colwise_gather_output" all-gathers them (replicated on every rank, no loss
parallelism); the other plans leave the output layer replicated or as their pair makes it.
"""

from __future__ import annotations

import re
from typing import Any

import torch
from torch import nn

from trainmem.errors import SetupError
from trainmem.parallel.apply import ParallelContext, Parallelized

_COLWISE_NAMES = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")
_ROWWISE_NAMES = ("o_proj", "down_proj")


def tp_styles() -> dict[str, Any]:
    """Hugging Face style name -> a factory of the torch style with the same input/output layouts."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel

    return {
        "colwise": lambda: ColwiseParallel(input_layouts=Replicate(), output_layouts=Shard(-1)),
        "rowwise": lambda: RowwiseParallel(input_layouts=Shard(-1), output_layouts=Replicate()),
        "colwise_gather_output": lambda: ColwiseParallel(input_layouts=Replicate(), output_layouts=Replicate()),
        "colwise_rep": lambda: ColwiseParallel(input_layouts=Replicate(), output_layouts=Replicate()),
        "rowwise_split_input": lambda: RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate()),
        "rowwise_rep": lambda: RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate()),
        # torch's RowwiseParallel defaults its input to Shard(-1): for token ids that would be read as a
        # sharded sequence and all-gathered; the ids are replicated (torchtitan: input_layouts=Replicate())
        "embedding_rowwise": lambda: RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate()),
        "sequence_parallel": lambda: SequenceParallel(use_local_output=True),
        # Qwen3's q_norm/k_norm: transformers keeps the weight whole and all-reduces its gradient in place
        # (tensor_parallel.py ReplicatedWithGradAllReduce, a post-accumulate-grad hook: no new storage);
        # here the weight is a replicated DTensor (torchtitan's NoParallel): the same bytes, the in-place
        # all-reduce not traced
        "replicated_with_grad_allreduce": _replicated_style,
    }


# ---- choosing the plan ---------------------------------------------------------------------------------
def _hf_plan(model: nn.Module) -> dict[str, str] | None:
    plan = getattr(model, "tp_plan", None)
    if not isinstance(plan, dict) or not plan:
        plan = getattr(model, "_tp_plan", None)
    return dict(plan) if isinstance(plan, dict) and plan else None


def _expand(model: nn.Module, plan: dict[str, str]) -> dict[str, str]:
    """Plan keys with '*' (a layer index) matched against the model's module names."""
    names = [name for name, _ in model.named_modules()]
    expanded: dict[str, str] = {}
    for pattern, style in plan.items():
        regex = re.compile(re.escape(pattern).replace(r"\*", r"\d+") + "$")
        for name in names:
            if regex.match(name):
                expanded[name] = style
    return expanded


def _name_plan(model: nn.Module) -> dict[str, str]:
    plan = {}
    for name, module in model.named_modules():
        leaf = name.rpartition(".")[2]
        if isinstance(module, nn.Linear) and leaf in _COLWISE_NAMES:
            plan[name] = "colwise"
        elif isinstance(module, nn.Linear) and leaf in _ROWWISE_NAMES:
            plan[name] = "rowwise"
    has_both = {"colwise", "rowwise"} <= set(plan.values())
    return plan if has_both else {}


def _sequential_plan(model: nn.Module) -> tuple[dict[str, str], list[str]]:
    """Consecutive Linear pairs in each nn.Sequential: (colwise, rowwise); an unpaired Linear is replicated."""
    plan: dict[str, str] = {}
    unpaired: list[str] = []
    for seq_name, seq in model.named_modules():
        if not isinstance(seq, nn.Sequential):
            continue
        linears = [f"{seq_name}.{child}" if seq_name else child
                   for child, module in seq.named_children() if isinstance(module, nn.Linear)]
        for index in range(0, len(linears) - 1, 2):
            plan[linears[index]], plan[linears[index + 1]] = "colwise", "rowwise"
        if len(linears) % 2:
            unpaired.append(linears[-1])
    return plan, unpaired


def _with_vocabulary(model: nn.Module, plan: dict[str, str], source: str) -> tuple[dict[str, str], str]:
    """torchtitan's llama3 plan (torchtitan/models/llama3/infra/parallelize.py apply_tp) also splits the
    vocabulary: tok_embeddings RowwiseParallel(input_layouts=Replicate()), output ColwiseParallel (logits
    Replicate without loss parallelism). Where a Llama-family plan leaves `embed_tokens` / `lm_head` out, they
    are added with the same layouts ("embedding_rowwise", "colwise_gather_output")."""
    added = []
    for name, module in model.named_modules():
        leaf = name.rpartition(".")[2]
        if name in plan:
            continue
        if leaf == "embed_tokens" and isinstance(module, nn.Embedding):
            plan[name] = "embedding_rowwise"
            added.append(name)
        elif leaf == "lm_head" and isinstance(module, nn.Linear):
            plan[name] = "colwise_gather_output"
            added.append(name)
    if added:
        source += (f"; {', '.join(added)} split on the vocabulary as torchtitan's Llama plan does (row-wise "
                   "embedding, column-wise output with its logits gathered)")
    return plan, source


def choose_plan(model: nn.Module) -> tuple[dict[str, str], str]:
    """(module name -> Hugging Face style name, where the plan comes from); refuses a model with none."""
    hf = _hf_plan(model)
    if hf is not None:
        expanded = _expand(model, hf)
        if expanded:
            return _with_vocabulary(model, expanded, f"the model's own Hugging Face tensor-parallel plan "
                                                     f"({type(model).__name__}.tp_plan)")
    named = _name_plan(model)
    if named:
        return _with_vocabulary(model, named, "Llama-family projection names (q/k/v/gate/up_proj column-wise, "
                                              "o_proj/down_proj row-wise)")
    paired, unpaired = _sequential_plan(model)
    if paired:
        where = "consecutive nn.Linear pairs in nn.Sequential stacks (column-wise, then row-wise)"
        if unpaired:
            where += f"; unpaired {', '.join(unpaired)} replicated on every rank"
        return paired, where
    raise SetupError(f"expected a model with a tensor-parallel plan (a Hugging Face tp_plan, Llama-style "
                     f"q/k/v/o and gate/up/down projections, or nn.Linear pairs in an nn.Sequential), got "
                     f"{type(model).__name__} with none", where="--tp")


# ---- checking that it divides ----------------------------------------------------------------------------
_COLWISE_STYLES = ("colwise", "colwise_gather_output", "colwise_rep")
_ROWWISE_STYLES = ("rowwise", "rowwise_split_input", "rowwise_rep")


def check_plan(model: nn.Module, plan: dict[str, str], tp: int) -> None:
    """Refuse, naming the module and dimension, a style torch has no match for or a split that is uneven."""
    modules = dict(model.named_modules())
    known = tp_styles()
    for name, style in plan.items():
        module = modules[name]
        if style not in known:
            raise SetupError(f"expected tensor-parallel styles trainmem maps onto torch's ({', '.join(known)}), "
                             f"got {style!r} for {name}", where="--tp")
        if style in _COLWISE_STYLES + _ROWWISE_STYLES and not isinstance(module, nn.Linear):
            raise SetupError(f"expected an nn.Linear for the {style} style, got {type(module).__name__} at {name}",
                             where="--tp")
        if style == "embedding_rowwise" and not isinstance(module, nn.Embedding):
            raise SetupError(f"expected an nn.Embedding for embedding_rowwise, got {type(module).__name__} at {name}",
                             where="--tp")
        split = {**dict.fromkeys(_COLWISE_STYLES, ("out_features", "output features")),
                 **dict.fromkeys(_ROWWISE_STYLES, ("in_features", "input features")),
                 "embedding_rowwise": ("num_embeddings", "vocabulary rows")}.get(style)
        if split is not None and getattr(module, split[0]) % tp:
            raise SetupError(f"expected {name}'s {split[1]} ({split[0]}={getattr(module, split[0]):,}) to divide by "
                             f"--tp {tp}, got a remainder of {getattr(module, split[0]) % tp}", where="--tp")
    _check_heads(model, plan, tp)


def _check_heads(model: nn.Module, plan: dict[str, str], tp: int) -> None:
    """Attention splits whole heads: each rank's q/k/v shard must hold heads/tp query and kv heads."""
    if not any(name.rpartition(".")[2] in ("q_proj", "k_proj", "v_proj") for name in plan):
        return
    config = getattr(model, "config", None)
    if config is not None and hasattr(config, "get_text_config"):
        config = config.get_text_config()
    for key in ("num_attention_heads", "num_key_value_heads"):
        heads = getattr(config, key, None)
        if isinstance(heads, int) and heads % tp:
            raise SetupError(f"expected the attention's {key} ({heads}) to divide by --tp {tp}, got a remainder of "
                             f"{heads % tp}", where="--tp")


# ---- applying it -------------------------------------------------------------------------------------------
def _tied_groups(model: nn.Module) -> list[list[tuple[str, str]]]:
    """(module name, parameter name) groups that share one Parameter object."""
    from trainmem.trace.torch_private import module_tensor_tables

    owners: dict[int, list[tuple[str, str]]] = {}
    for module_name, module in model.named_modules(remove_duplicate=False):
        for param_name, param in module_tensor_tables(module)[0].items():
            if param is not None and (module_name, param_name) not in owners.setdefault(id(param), []):
                owners[id(param)].append((module_name, param_name))
    return [group for group in owners.values() if len(group) > 1]


def _retie(model: nn.Module, groups: list[list[tuple[str, str]]]) -> None:
    """parallelize_module replaces each module's parameter with a new DTensor Parameter, so a tied weight
    (Llama 3.2's embed_tokens / lm_head) becomes two; tie them again when the plan split both alike."""
    from torch.distributed.tensor import DTensor

    from trainmem.trace.torch_private import module_tensor_tables

    modules = dict(model.named_modules(remove_duplicate=False))
    for group in groups:
        params = [module_tensor_tables(modules[m])[0][p] for m, p in group]
        layouts = {(tuple(p.placements) if isinstance(p, DTensor) else "replicated") for p in params}
        if len(layouts) > 1:
            names = ", ".join(f"{m}.{p}" for m, p in group)
            raise SetupError(f"expected tied weights ({names}) to be split alike by the tensor-parallel plan, got "
                             f"{' and '.join(map(str, layouts))}", where="--tp")
        for module_name, param_name in group[1:]:
            module_tensor_tables(modules[module_name])[0][param_name] = params[0]


def parallelize(model: nn.Module, tp_mesh: Any, tp: int, sequence_parallel: bool = False) -> tuple[nn.Module, str]:
    """Split the meta-built model over `tp_mesh`; returns it and a note saying which plan was used. With
    `sequence_parallel` (a whole model, not pipeline stages), a Llama-family causal LM also gets torchtitan's
    sequence parallelism (parallel/tp_sequence.py)."""
    from torch.distributed.tensor.parallel import parallelize_module

    from trainmem.parallel.tp_sequence import sequence_parallel_styles

    plan, source = choose_plan(model)
    check_plan(model, plan, tp)
    groups = _tied_groups(model)
    styles = tp_styles()
    sequence = sequence_parallel_styles(model, plan) if sequence_parallel else None
    parallelize_module(model, tp_mesh, sequence or {name: styles[style]() for name, style in plan.items()})
    _retie(model, groups)
    note = f"tensor parallel over {tp} ranks: {len(plan)} modules split by {source}"
    if sequence:
        note += ("; sequence parallelism as torchtitan's default Llama plan (norms and the residual stream sharded "
                 "on the sequence, attention/MLP inputs all-gathered, their outputs reduce-scattered)")
    replicated, left = replicate_rest(model, tp_mesh)
    if replicated:
        note += (f"; the other {replicated} modules with parameters replicated as DTensors on the tensor-parallel "
                 "mesh (whole on every rank, as torchtitan's NoParallel/SequenceParallel do), so that one foreach "
                 "optimizer sees DTensors only")
    if left:
        note += (f"; {', '.join(left)} kept as plain tensors (they own parameters and hold submodules with "
                 "parameters, so no input/output layout fits them): the optimizer groups them apart")
    return model, note


# ---- the parameters no style splits ------------------------------------------------------------------------
def _plain_owners(model: nn.Module) -> list[tuple[str, nn.Module]]:
    from torch.distributed.tensor import DTensor

    return [(name, module) for name, module in model.named_modules()
            if any(p is not None and not isinstance(p, DTensor) for p in module._parameters.values())]


def _replicated_style() -> Any:
    """torchtitan's NoParallel style ("to ensure all parameters are on the same 1D/2D mesh, which is assumed by
    ... optimizer fused implementation", its comment): parameters replicated on the tp mesh, inputs read as
    Replicate DTensors, outputs handed back as local tensors. Every rank
    holds the whole tensor, as it did as a plain tensor; `from_local` wraps the same storage (no copy, no
    broadcast: on meta there is nothing to broadcast, and torchtitan initializes them alike on every rank)."""
    from torch.distributed.tensor import DTensor, Replicate, distribute_module
    from torch.distributed.tensor.parallel import ParallelStyle

    def partition(_name: str, module: nn.Module, mesh: Any) -> None:
        for key, param in list(module._parameters.items()):
            if param is not None and not isinstance(param, DTensor):
                local = DTensor.from_local(param.data, mesh, [Replicate()], run_check=False)
                module.register_parameter(key, nn.Parameter(local, requires_grad=param.requires_grad))

    def inputs(_module: nn.Module, args: tuple, mesh: Any) -> tuple:
        return tuple(DTensor.from_local(a, mesh, [Replicate()], run_check=False)
                     if isinstance(a, torch.Tensor) and not isinstance(a, DTensor) else a for a in args)

    def outputs(_module: nn.Module, out: Any, _mesh: Any) -> Any:
        from trainmem.trace.torch_private import tree_map

        return tree_map(lambda t: t.to_local() if isinstance(t, DTensor) else t, out)

    class Replicated(ParallelStyle):
        def _apply(self, module: nn.Module, device_mesh: Any) -> nn.Module:
            return distribute_module(module, device_mesh, partition, inputs, outputs)

    return Replicated()


def replicate_rest(model: nn.Module, tp_mesh: Any) -> tuple[int, list[str]]:
    """Make the parameters the plan left plain (norms, an unpaired output Linear) replicated DTensors on the tp
    mesh, so that every parameter is a DTensor, as in torchtitan: a foreach/fused optimizer (CUDA's default)
    refuses a list mixing DTensors and plain tensors ("_foreach_lerp_ got mixed torch.Tensor and DTensor").
    Only modules without parameter-holding submodules take the style (their inputs and outputs can be converted
    at their boundary); (count replicated, names left plain)."""
    from torch.distributed.tensor.parallel import parallelize_module

    replicated, left = 0, []
    for name, module in _plain_owners(model):
        if any(True for child in module.children() for _ in child.parameters()):
            left.append(name or type(module).__name__)
            continue
        parallelize_module(module, tp_mesh, _replicated_style())
        replicated += 1
    return replicated, left


def on_meta(model: nn.Module, ctx: ParallelContext) -> nn.Module:
    model, note = parallelize(model, ctx.world.tp_mesh(), ctx.layout.tp, sequence_parallel=ctx.layout.pp == 1)
    ctx.notes.append(note)
    return model


def on_fake(model: nn.Module, ctx: ParallelContext) -> Parallelized:
    """Nothing to add after materialization: the DTensor parameters and their hooks do the communication."""
    return Parallelized(model)


def local_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard (what this rank holds), else the tensor."""
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor
