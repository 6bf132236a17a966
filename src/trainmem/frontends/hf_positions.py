"""The learned position tables of an `hf:` model: a sequence longer than a table holds is refused (a real run indexes
past it and fails; fake tensors never look at an index), and fit's longest sequence is the shortest table's."""

from __future__ import annotations

from trainmem.errors import SetupError


def max_sequence_length(text: str) -> int | None:
    """The longest sequence an hf: reference takes, or None: what its learned position table holds (the
    model built on meta, as --seq-len is checked), else the config's position limit."""
    from trainmem.errors import TrainmemError
    from trainmem.frontends.hf import from_hf_ref, max_positions, model_code, resolve_config
    from trainmem.setup import TrainingSetup
    from trainmem.trace.meta_build import building_on_meta

    resolved = resolve_config(text)
    limit = max_positions(resolved.values)
    if model_code(resolved.auto_map):  # the repository's code runs only for an estimate the user trusts
        return limit
    try:
        # as the trace builds (torch 2.8: transformers' first import of GenerationMixin under the meta device
        # imports torch._dynamo, whose import-time tensors fail there; building_on_meta imports it first)
        with building_on_meta():
            model = from_hf_ref(f"hf:{text}", TrainingSetup(seq_len=1)).build()
    except TrainmemError:
        return limit
    tables = position_tables(model)
    return min(positions for _, positions in tables) if tables else limit


def within_positions(build, seq_len: int, given: bool = True):
    """The built model, refused when its sequences are longer than a learned position table holds: a real
    run indexes past the table and fails, while the fake tensors of the trace never look at an index.
    Rotary and relative positions have no table and no such limit."""
    model = build()
    for name, positions in position_tables(model):
        if seq_len > positions and given:
            raise SetupError(f"expected --seq-len of at most {positions} (the model's learned positions, {name}), "
                             f"got {seq_len}", where="--seq-len")
        if seq_len > positions:  # the default, from a position limit that counts more rows than positions
            raise SetupError(f"expected a sequence length of at most {positions} (the model's learned positions, "
                             f"{name}), got the default {seq_len} from the config; give --seq-len {positions}",
                             where="--seq-len")
    return model


def position_tables(model) -> list[tuple[str, int]]:
    """(module name, positions it holds) for each learned position embedding of `model`."""
    import torch

    tables = []
    for name, module in model.named_modules():
        leaf = name.rsplit(".", 1)[-1].lower()
        if isinstance(module, torch.nn.Embedding) and ("pos" in leaf or leaf == "wpe"):  # wpe: GPT-2's, GPT-Neo's
            # OPT and BART shift positions by `offset`; RoBERTa's start after its padding index
            first = getattr(module, "offset", 0) + (module.padding_idx + 1 if module.padding_idx is not None else 0)
            tables.append((name, module.num_embeddings - first))
    return tables
