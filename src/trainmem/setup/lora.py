"""`--lora`: peft's LoRA as a spec, QLoRA's default one, and `own` (the model brings its adapters)."""

from __future__ import annotations

import dataclasses
from typing import Any

from trainmem.errors import expected


@dataclasses.dataclass(frozen=True)
class LoraSpec:
    """`--lora r=16,alpha=32,targets=q_proj,v_proj[,dropout=0.05]`; no targets: peft's defaults."""

    r: int = 8
    alpha: int = 8
    targets: tuple[str, ...] = ()
    dropout: float = 0.0

    @classmethod
    def parse(cls, text: str) -> LoraSpec:
        values: dict[str, Any] = {}
        targets: list[str] = []
        key = None
        for part in (p.strip() for p in str(text).split(",") if p.strip()):
            name, sep, value = part.partition("=")
            if sep:
                key = name.strip().lower()
                if key not in ("r", "alpha", "targets", "dropout"):
                    raise expected("--lora keys r, alpha, targets, dropout", name, "--lora")
                if key == "targets":
                    targets.append(value.strip())
                else:
                    values[key] = value.strip()
            elif key == "targets":  # targets=q_proj,v_proj: the list goes on until the next key
                targets.append(part)
            else:
                raise expected("--lora as r=16,alpha=32,targets=q_proj,v_proj, or own (the model's own adapters)", text, "--lora")
        try:
            spec = cls(r=int(values.get("r", 8)), alpha=int(values.get("alpha", values.get("r", 8))),
                       targets=tuple(targets), dropout=float(values.get("dropout", 0.0)))
        except ValueError:
            raise expected("--lora numbers (r and alpha integers, dropout a probability)", text, "--lora") from None
        if spec.r < 1 or not 0.0 <= spec.dropout < 1.0:
            raise expected("--lora with r ≥ 1 and dropout in [0, 1)", text, "--lora")
        return spec


# QLoRA (Dettmers et al. 2023): LoRA on every linear layer, r=64, alpha=16, dropout 0.1 (models up to
# 13B), bf16 compute, paged 8-bit AdamW, gradient checkpointing (peft prepare_model_for_kbit_training)
QLORA_LORA = LoraSpec(r=64, alpha=16, targets=("all-linear",), dropout=0.1)
OWN_ADAPTERS = "own"  # --lora own (TrainingSetup.own_adapters)
