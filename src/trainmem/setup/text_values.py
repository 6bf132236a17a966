"""How a setup or run key's value is read from text: one converter a key, shared by the command line's flags
(cli/parser.py and cli/parallel_flags.py take their `type=` from here), `--sweep KEY=V1,V2` and
`trainmem.sweep(over={"key": "v1,v2"})`. tests/test_text_values.py holds every flag of the compare command to
this table, so a flag and a swept value can never read the same text differently.

A key not listed is read as the text itself. Errors are argparse.ArgumentTypeError (the flag's own parser
says what it expects), ValueError from int/float.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from typing import Any


def _yes_no(expected: str) -> Callable[[str], bool]:
    """A reader of a yes/no value (on|off, true|false, yes|no, 1|0) that names `expected` when the text is none."""
    def read(text: str) -> bool:
        value = str(text).strip().lower()
        if value in ("on", "true", "yes", "1"):
            return True
        if value in ("off", "false", "no", "0"):
            return False
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")

    return read


on_off = _yes_no("on|off (or true|false)")  # a switch (--checkpointing) given a value
true_false = _yes_no("true or false")  # a layout knob (--reshard-after-forward false)


def one_of(choices: Sequence[str]) -> Callable[[str], str]:
    """A value from a fixed list, as argparse's `choices` checks it."""
    def checked(text: str) -> str:
        if text not in choices:
            raise argparse.ArgumentTypeError(f"expected {'|'.join(map(str, choices))}, got {text!r}")
        return text

    checked.choices = tuple(choices)  # type: ignore[attr-defined] - the parser's `choices=` reads them
    return checked


MODULE_LOADING = one_of(("lazy", "eager"))
NO_CLIPPING = "none"  # --max-grad-norm none: no clipping, where a preset (--hf-trainer) clips


def norm_or_none(text: str) -> float | str:
    """--max-grad-norm: a norm, or `none` (NO_CLIPPING) for no clipping where a preset (--hf-trainer) clips."""
    if str(text).strip().lower() == NO_CLIPPING:
        return NO_CLIPPING
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a gradient norm such as 1.0, or none (no clipping), got "
                                         f"{text!r}") from None

TEXT_VALUES: dict[str, Callable[[str], Any]] = {
    # the training setup
    "batch_size": int, "grad_accum": int, "seq_len": int, "run_steps": int, "input_max": int,
    "dropout": float, "max_grad_norm": norm_or_none,
    "checkpointing": on_off, "resume": on_off, "compile": on_off, "hf_trainer": on_off, "qlora": on_off, "trust_remote_code": on_off,
    # the run on a GPU
    "cudnn_benchmark": on_off, "module_loading": MODULE_LOADING,
    # the parallel layout
    "dp": int, "dp_shard": int, "tp": int, "pp": int, "world_size": int, "gpus_per_node": int, "microbatches": int,
    "stages_per_rank": int, "fsdp_prefetch": int, "zero3_persistence_threshold": int, "zero3_prefetch_bucket": int,
    "ddp_bucket_mb": float, "gradient_as_bucket_view": true_false, "reshard_after_forward": true_false,
    "fsdp1_use_orig_params": true_false, "fsdp1_forward_prefetch": true_false,
}


def reader(key: str) -> Callable[[str], Any]:
    """The converter of `key`'s text (the text itself for a key read as text)."""
    return TEXT_VALUES.get(key, str)
