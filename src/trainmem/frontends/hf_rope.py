"""A config.json's rotary-position settings (rope_scaling, rope_parameters, rope_theta, partial_rotary_factor),
checked before transformers reads them.

transformers checks little of them and late: an unknown rope_type fails as a bare KeyError when the first
attention layer is built, a factor given as text as a TypeError inside the rotary embedding, a rope_theta of 0
as a ZeroDivisionError, and a negative factor is accepted with a logged warning. Each becomes one line naming the
file and the key (`…/config.json: rope_scaling.factor`). Only the keys transformers reads are checked: what each
rope_type needs (transformers 5.x, modeling_rope_utils: _validate_<type>_rope_parameters) and the numbers it
computes with. A config that names its own code (auto_map) may read its own types: its rope_type is not checked.
"""

from __future__ import annotations

from typing import Any

from trainmem.errors import ModelRefError
from trainmem.frontends.hf_hub import clip_text

ROPE_KEYS = ("rope_scaling", "rope_parameters")  # rope_scaling up to transformers 4.x, rope_parameters from 5.0
EXAMPLE = '{"rope_type": "linear", "factor": 2.0}'
# what a type needs besides its name; original_max_position_embeddings and rope_theta are filled from the
# config when absent (transformers' standardize_rope_params)
REQUIRED = {"linear": ("factor",), "dynamic": ("factor",), "yarn": ("factor",),
            "llama3": ("factor", "low_freq_factor", "high_freq_factor"), "longrope": ("short_factor", "long_factor")}
# names beside transformers' table of rope functions that its model configs accept: the original rope (default),
# Phi-3's old name for longrope (su), Qwen2-VL's multimodal rope (mrope), the axial rope of vision models
OTHER_TYPES = ("default", "su", "mrope", "axial")
POSITIVE = ("factor", "low_freq_factor", "high_freq_factor", "rope_theta", "original_max_position_embeddings")
NUMBERS = ("attention_factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim")
LISTS = ("short_factor", "long_factor")
# every key a rope dict may hold: a dict of dicts without any of them holds one per layer type (full_attention…)
PARAMETERS = frozenset(("rope_type", "type", "partial_rotary_factor", "truncate", "mrope_section",
                        *REQUIRED["llama3"], *POSITIVE, *NUMBERS, *LISTS))


def known_types() -> frozenset[str] | None:
    """The rope types this transformers builds, or None where it cannot be imported (the build refuses later,
    with the install hint)."""
    try:
        from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    except Exception:  # noqa: BLE001 - not installed, or broken: the model's build says which
        return None
    return frozenset(ROPE_INIT_FUNCTIONS) | frozenset(OTHER_TYPES)


def check_rope(value: Any, key_path: str, where: str, own_code: bool) -> None:
    """rope_scaling / rope_parameters at `key_path` of the file `where`: null, an empty object, the parameters of
    one rope, or one such object per layer type."""
    if value is None or value == {}:
        return
    if not isinstance(value, dict):
        raise ModelRefError(f"expected an object such as {EXAMPLE}, got {_shown(value)}", where=_at(where, key_path))
    per_layer = not (set(value) & PARAMETERS) and all(item is None or isinstance(item, dict) for item in value.values())
    for name, parameters in (value.items() if per_layer else [("", value)]):
        if parameters is not None:  # a layer type without rope (NoPE)
            _check_parameters(parameters, f"{key_path}.{name}" if name else key_path, where, own_code)


def check_rope_number(key: str, value: Any, key_path: str, where: str) -> None:
    """rope_theta and partial_rotary_factor where a config holds them outside the rope object."""
    if key == "rope_theta":
        _positive(value, key_path, where)
    elif key == "partial_rotary_factor" and value is not None and not (_is_number(value) and 0 <= value <= 1):
        raise ModelRefError(f"expected a fraction of the head from 0 to 1, got {_shown(value)}",
                            where=_at(where, key_path))


def _check_parameters(parameters: dict[str, Any], key_path: str, where: str, own_code: bool) -> None:
    key = "rope_type" if "rope_type" in parameters else "type"
    rope_type = parameters.get(key, "default")
    if not isinstance(rope_type, str):
        raise ModelRefError(f"expected a rope type name such as \"linear\", got {_shown(rope_type)}",
                            where=_at(where, f"{key_path}.{key}"))
    types = None if own_code else known_types()
    if types is not None and rope_type not in types:
        raise ModelRefError(f"expected a rope type transformers builds ({', '.join(sorted(types))}), got "
                            f"{clip_text(repr(rope_type), 40)}", where=_at(where, f"{key_path}.{key}"))
    missing = [name for name in REQUIRED.get(rope_type, ()) if parameters.get(name) is None]
    if missing:
        raise ModelRefError(f"expected {' and '.join(missing)} for rope type {rope_type!r}, got "
                            f"{'null' if missing[0] in parameters else 'none'}", where=_at(where, f"{key_path}.{missing[0]}"))
    for name in POSITIVE:
        _positive(parameters.get(name), f"{key_path}.{name}", where)
    for name in NUMBERS:
        value = parameters.get(name)
        if value is not None and not _is_number(value):
            raise ModelRefError(f"expected a number, got {_shown(value)}", where=_at(where, f"{key_path}.{name}"))
    for name in LISTS:
        value = parameters.get(name)
        if value is not None and not (isinstance(value, list) and all(_is_number(item) for item in value)):
            raise ModelRefError(f"expected a list of numbers, got {_shown(value)}", where=_at(where, f"{key_path}.{name}"))
    check_rope_number("partial_rotary_factor", parameters.get("partial_rotary_factor"),
                      f"{key_path}.partial_rotary_factor", where)
    low, high = parameters.get("low_freq_factor"), parameters.get("high_freq_factor")
    if rope_type == "llama3" and high <= low:  # llama3 divides by their difference
        raise ModelRefError(f"expected high_freq_factor above low_freq_factor ({low}), got {high}",
                            where=_at(where, f"{key_path}.high_freq_factor"))


def _positive(value: Any, key_path: str, where: str) -> None:
    if value is not None and not (_is_number(value) and value > 0):
        raise ModelRefError(f"expected a number above 0, got {_shown(value)}", where=_at(where, key_path))


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _shown(value: Any) -> str:
    kind = {dict: "an object", list: "an array", str: "the string", bool: "the boolean"}.get(type(value), "")
    return f"{kind} {clip_text(repr(value), 40)}".strip()


def _at(where: str, key_path: str) -> str:
    return f"{where}: {clip_text(key_path, 60)}"
