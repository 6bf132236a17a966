"""Presets: values a flag fills in unless the user gave them (--qlora, --hf-trainer, --torch-version).

--torch-version X.Y: the defaults of the torch the run used, where they differ from the installed one's and
decide memory. A published run made with torch 1.13 kept its gradients between steps and stepped its optimizer
one tensor at a time; the installed torch would not. Each default, with where it changed:
- `Optimizer.zero_grad()` frees the gradients (set_to_none=True) from torch 2.0 (pytorch #92731); before, it
  zeroed them in place, so they stay allocated across steps: `zero_grad = "zeros"`;
- torch.optim's optimizers default to the foreach implementation on CUDA parameters from torch 2.0 (#92306,
  #95862: "One major difference between 1.13 and 2.0 is that we now default to the faster foreach
  implementation", #97712); before, the for-loop, on every device: `optimizer_impl = "for-loop"`;
- transformers' Trainer asks for the fused AdamW from torch 2.8 (trainer_defaults.py).
Everything else (kernels, autocast lists, attention backends) is the installed torch's: it is what is traced.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from trainmem.errors import expected
from trainmem.setup import trainers
from trainmem.trainer_defaults import installed_torch_version, release_of, trainer_optimizer_impl

# QLoRA (Dettmers et al. 2023): bf16 compute, paged 8-bit AdamW, gradient checkpointing (peft
# prepare_model_for_kbit_training); its LoRA (r=64, alpha=16, every linear layer) is setup.lora.QLORA_LORA
QLORA_DEFAULTS = {"optimizer": "paged-adamw-8bit", "precision": "bf16-mixed", "checkpointing": True}
# transformers TrainingArguments (5.x): optim adamw_torch_fused with torch >= 2.8, adamw_torch (torch's default
# AdamW implementation) before (trainer_defaults.py); max_grad_norm 1.0, evaluation off; Trainer.training_step:
# loss / gradient_accumulation_steps, zero_grad to None; under mixed precision the Accelerator converts model
# outputs to fp32 (trace/trainer_forward.py)
HF_TRAINER_DEFAULTS = {"optimizer": "adamw", "optimizer_impl": trainer_optimizer_impl(), "max_grad_norm": 1.0,
                       "loop": "trainer"}
DEFAULTS_CHANGED_IN = (2, 0)  # zero_grad's set_to_none and the foreach default (module docstring)
BEFORE_2_0 = {"zero_grad": "zeros", "optimizer_impl": "for-loop"}
ONE_IMPLEMENTATION = frozenset({"lion", "adamw-8bit", "paged-adamw-8bit"})  # setup.Optimizer's, not torch.optim's


def torch_release(text: Any) -> tuple[int, int]:
    """(major, minor) of a torch version given as text (1.13, 2.1.2, 2.8.0+cu128); one line for anything else."""
    if not isinstance(text, str):  # a TOML number would read 2.10 as 2.1
        raise expected('a torch version as text such as "1.13" or "2.10"', text, "--torch-version")
    release = release_of(text)
    if release is None or release[0] not in (1, 2):
        raise expected("a torch version such as 1.13 or 2.1.2", text, "--torch-version")
    return release


def bnb_release(text: Any) -> tuple[int, int, int]:
    """(major, minor, patch) of a bitsandbytes version (0.41.1, 0.45, 0.49.0.dev0); one line for anything else."""
    if not isinstance(text, str):  # a TOML number would read 0.41 as a float
        raise expected('a bitsandbytes version as text such as "0.41.1"', text, "--bnb-version")
    match = re.match(r"(\d{1,4})\.(\d{1,4})(?:\.(\d{1,4}))?(?![\d])", text.strip())
    if match is None:
        raise expected("a bitsandbytes version such as 0.41.1 or 0.45", text, "--bnb-version")
    return int(match.group(1)), int(match.group(2)), int(match.group(3) or 0)


BNB_QUANT_TYPES = ("nf4-dq", "nf4")  # bitsandbytes' 4-bit NF4 with or without double-quantized statistics
QLORA_LAYERS = ("transformers", "all")  # which linear layers are 4-bit (trace/finetune.py quantize_4bit)
BNB_COMPUTE_DTYPES = ("bf16", "fp16", "fp32")  # bnb_4bit_compute_dtype: what a 4-bit layer computes in


def check_library_settings(setup: Any) -> None:
    """A setup's library versions and bitsandbytes' 4-bit type, where given (one line naming the flag otherwise);
    the bitsandbytes settings only describe --qlora's layers, so without it they would change nothing."""
    if setup.torch_version is not None:
        torch_release(setup.torch_version)
    for flag, value in (("--bnb-version", setup.bnb_version), ("--bnb-quant", setup.bnb_quant),
                        ("--qlora-layers", setup.qlora_layers), ("--bnb-compute-dtype", setup.bnb_compute_dtype)):
        if value is not None and not setup.qlora:
            raise expected("--qlora beside it (it describes QLoRA's 4-bit layers)", value, flag)
    if setup.bnb_version is not None:
        bnb_release(setup.bnb_version)
    for flag, value, allowed in (("--bnb-quant", setup.bnb_quant, BNB_QUANT_TYPES),
                                 ("--qlora-layers", setup.qlora_layers, QLORA_LAYERS),
                                 ("--bnb-compute-dtype", setup.bnb_compute_dtype, BNB_COMPUTE_DTYPES)):
        if value is not None and value not in allowed:
            raise expected(" or ".join(allowed), value, flag)


def hf_trainer_defaults(torch_version: str | None) -> dict[str, Any]:
    return {**HF_TRAINER_DEFAULTS, "optimizer_impl": trainer_optimizer_impl(torch_version)}


def torch_version_defaults(torch_version: str | None) -> dict[str, Any]:
    if torch_version is None or torch_release(torch_version) >= DEFAULTS_CHANGED_IN:
        return {}
    return dict(BEFORE_2_0)


def apply(values: Mapping[str, Any]) -> dict[str, Any]:
    """The setup values with each preset's defaults under what was given. The Trainer's AdamW is torch's default
    implementation before torch 2.8, so under --torch-version before 2.0 that default is the for-loop too."""
    given, version = dict(values), values.get("torch_version")
    trainers.reconcile(given)  # --trainer hf is --hf-trainer
    filled: dict[str, Any] = trainers.loop_defaults(given)
    if given.get("qlora"):
        filled.update(QLORA_DEFAULTS)
    if given.get("hf_trainer"):
        filled.update(hf_trainer_defaults(version))
    optimizer = str(given.get("optimizer", filled.get("optimizer", "adam")))
    for key, value in torch_version_defaults(version).items():
        if key == "optimizer_impl" and optimizer in ONE_IMPLEMENTATION:
            continue  # trainmem's stand-ins for lion and bitsandbytes' optimizers have one implementation
        if filled.get(key, "default") == "default":
            filled[key] = value
    return {**filled, **given}


def filled_by(values: Mapping[str, Any], name: str, value: Any) -> str | None:
    """The preset flag whose default `value` of `name` is, in the user's words; None when none filled it."""
    version, trainer = values.get("torch_version"), values.get("trainer")
    for flag, on, defaults in (("--qlora", values.get("qlora"), QLORA_DEFAULTS),
                               (f"--trainer {trainer}", trainer, trainers.loop_defaults({"trainer": trainer})),
                               ("--hf-trainer", values.get("hf_trainer"), hf_trainer_defaults(version)),
                               (f"--torch-version {version}", version, torch_version_defaults(version))):
        if on and name in defaults and str(value) == str(defaults[name]):
            return f"{flag} (its {name.replace('_', '-')} {value})"
    return None


def said(setup: Any) -> list[str]:
    """The report's line on --torch-version: the defaults of that torch in effect (a value given beside it wins),
    and what stays the installed torch's."""
    if setup.torch_version is None:
        return []
    taken = [words for key, words in (("zero_grad", "zero_grad keeps the gradients (set_to_none=False)"),
                                      ("optimizer_impl", "the optimizer steps one tensor at a time (for-loop)"))
             if str(getattr(setup, key)) == torch_version_defaults(setup.torch_version).get(key)]
    defaults = ", ".join(taken) if taken else "the same as the installed torch's here"
    return [f"--torch-version {setup.torch_version}: torch {setup.torch_version}'s defaults where they decide memory "
            f"({defaults}); the kernels, autocast lists and attention backends traced are the installed torch "
            f"{installed_torch_version()}'s"]
