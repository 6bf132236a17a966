"""A layer spec in YAML or JSON, so that a person can describe a network without code:

    input: [3, 32, 32]          # one sample's shape (required)
    input_dtype: float32        # optional; int64 for token ids
    input_max: 50257            # optional; token ids are < this (defaults to the first vocabulary)
    loss: cross-entropy         # optional
    layers:
      - conv2d: {out_channels: 16, kernel_size: 3, padding: 1}
      - batchnorm
      - relu
      - maxpool2d: {kernel_size: 2}
      - flatten
      - linear: {out_features: 10}

Input sizes (in_features, in_channels, input_size, BatchNorm/LayerNorm widths) are inferred by
running each layer on a meta tensor, so a spec names only what a person would choose.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from trainmem.errors import ModelRefError, one_line, quote
from trainmem.frontends.mlp import MAX_LAYERS
from trainmem.setup import InputSpec, Loss

_TOP_KEYS = {"input", "input_dtype", "input_max", "loss", "layers", "name"}


def _nn():
    import torch.nn as nn

    return nn


class TakeOutput:
    """Wraps an LSTM/GRU/RNN so that the next layer gets the output sequence, not (output, state)."""

    @staticmethod
    def wrap(rnn):
        nn = _nn()

        class RecurrentOutput(nn.Module):
            def __init__(self, inner):
                super().__init__()
                self.rnn = inner

            def forward(self, x):
                return self.rnn(x)[0]

        return RecurrentOutput(rnn)


def _layer_table() -> dict[str, tuple[Any, Any]]:
    """name -> (constructor, function(shape) -> kwargs inferred from the incoming per-sample shape)."""
    nn = _nn()
    last = lambda shape: shape[-1]  # noqa: E731
    first = lambda shape: shape[0]  # noqa: E731
    batchnorm = lambda **kw: {1: nn.BatchNorm1d, 2: nn.BatchNorm1d, 3: nn.BatchNorm2d, 4: nn.BatchNorm3d}[kw.pop("_rank")](**kw)  # noqa: E731
    recurrent = lambda cls: (lambda **kw: TakeOutput.wrap(cls(batch_first=True, **kw)))  # noqa: E731
    plain = lambda shape: {}  # noqa: E731
    return {
        "linear": (nn.Linear, lambda s: {"in_features": last(s)}),
        "conv1d": (nn.Conv1d, lambda s: {"in_channels": first(s)}),
        "conv2d": (nn.Conv2d, lambda s: {"in_channels": first(s)}),
        "conv3d": (nn.Conv3d, lambda s: {"in_channels": first(s)}),
        "convtranspose2d": (nn.ConvTranspose2d, lambda s: {"in_channels": first(s)}),
        "batchnorm": (batchnorm, lambda s: {"num_features": first(s), "_rank": len(s)}),
        "layernorm": (nn.LayerNorm, lambda s: {"normalized_shape": last(s)}),
        "embedding": (nn.Embedding, plain),
        "lstm": (recurrent(nn.LSTM), lambda s: {"input_size": last(s)}),
        "gru": (recurrent(nn.GRU), lambda s: {"input_size": last(s)}),
        "rnn": (recurrent(nn.RNN), lambda s: {"input_size": last(s)}),
        "relu": (nn.ReLU, plain), "tanh": (nn.Tanh, plain), "gelu": (nn.GELU, plain),
        "sigmoid": (nn.Sigmoid, plain), "silu": (nn.SiLU, plain), "leakyrelu": (nn.LeakyReLU, plain),
        "softmax": (lambda **kw: nn.Softmax(dim=kw.get("dim", -1)), plain),
        "dropout": (nn.Dropout, plain), "flatten": (nn.Flatten, plain),
        "maxpool1d": (nn.MaxPool1d, plain), "maxpool2d": (nn.MaxPool2d, plain),
        "avgpool1d": (nn.AvgPool1d, plain), "avgpool2d": (nn.AvgPool2d, plain),
        "adaptiveavgpool1d": (nn.AdaptiveAvgPool1d, plain), "adaptiveavgpool2d": (nn.AdaptiveAvgPool2d, plain),
    }


# The torch.nn class whose constructor arguments a layer name takes, where the table builds it through a
# lambda (batchnorm picks 1d/2d/3d by rank with the same arguments; recurrent layers fix batch_first).
_ARGUMENTS_OF = {"batchnorm": "BatchNorm1d", "lstm": "LSTM", "gru": "GRU", "rnn": "RNN", "softmax": "Softmax"}
# A spec file is data: it may size a layer, never place or type its tensors. `device` would build the
# layer outside the meta device, allocating its weights for real; `dtype` is --precision's to decide.
_NEVER_FROM_A_SPEC = frozenset({"device", "dtype", "batch_first", "_rank"})


def _check_arguments(name: str, constructor: Any, kwargs: dict[str, Any], index: int, where: str) -> None:
    """An allow-list: each argument must be one the torch.nn constructor takes, a bool where its default
    is a bool, a whole number where it is a size, never device or dtype."""
    import inspect

    cls = getattr(_nn(), _ARGUMENTS_OF.get(name, ""), None) or constructor
    parameters = dict(inspect.signature(cls.__init__).parameters) if isinstance(cls, type) else {}
    if name in ("lstm", "gru", "rnn"):  # RNNBase takes its arguments as *args/**kwargs: name them
        parameters = {key: inspect.Parameter(key, inspect.Parameter.KEYWORD_ONLY, default=default) for key, default in
                      {"input_size": 0, "hidden_size": 0, "num_layers": 1, "bias": True, "dropout": 0.0,
                       "bidirectional": False, "proj_size": 0, "nonlinearity": "tanh"}.items()}
    allowed = sorted(set(parameters) - {"self", "args", "kwargs"} - _NEVER_FROM_A_SPEC)
    for key, value in kwargs.items():
        if key not in allowed:
            raise ModelRefError(f"expected layer {index} ({name}) arguments among {', '.join(allowed) or 'none'}, "
                                f"got {quote(key)}", where=where)
        default = parameters[key].default
        if isinstance(default, bool) and not isinstance(value, bool):
            raise ModelRefError(f"expected true or false for layer {index} ({name}) argument {quote(key)}, got {quote(value)}",
                                where=where)
        # sizes (in_features: int, hidden_size) are numbers; others, such as Conv2d's padding, also take text
        size = default is inspect.Parameter.empty and parameters[key].annotation in (int, "int")
        if (size or name in ("lstm", "gru", "rnn") and key.endswith("_size")) and (
                isinstance(value, bool) or not isinstance(value, int)):
            raise ModelRefError(f"expected a number for layer {index} ({name}) argument {quote(key)}, got {quote(value)}",
                                where=where)
        if not _plain_value(value):
            raise ModelRefError(f"expected a number, true/false, text or a list of numbers for layer {index} "
                                f"({name}) argument {quote(key)}, got {quote(value)}", where=where)


def _plain_value(value: Any) -> bool:
    if isinstance(value, (bool, int, float, str)):
        return True
    return isinstance(value, (list, tuple)) and len(value) <= 8 and all(
        isinstance(item, (int, float)) and not isinstance(item, bool) for item in value)


def _parse_entry(entry: Any, index: int, where: str) -> tuple[str, dict[str, Any]]:
    if isinstance(entry, str):
        return entry.lower(), {}
    if isinstance(entry, dict) and "type" in entry:
        kwargs = dict(entry)
        return str(kwargs.pop("type")).lower(), kwargs
    if isinstance(entry, dict) and len(entry) == 1:
        (name, kwargs), = entry.items()
        return str(name).lower(), dict(kwargs or {})
    raise ModelRefError(f"expected layer {index} as a name or {{name: {{args}}}}, got {quote(entry)}", where=where)


def _layer_type_hint(name: str, table: dict[str, Any]) -> str:
    """The nearest layer type to a typo; the whole list only for a name a person could have typed."""
    import difflib

    close = difflib.get_close_matches(name, sorted(table), n=1) if len(name) <= 40 else []
    if close:
        return f"such as {close[0]}"
    return f"among {', '.join(sorted(table))}" if len(name) <= 40 else "of torch.nn (linear, conv2d, relu, …)"


def _plan_layers(spec: dict[str, Any], where: str) -> list[tuple[str, dict[str, Any]]]:
    """Infer each layer's input-dependent kwargs by running the layers on a meta tensor."""
    import torch

    table = _layer_table()
    shape = tuple(spec["input"])
    is_integer = str(spec.get("input_dtype", "float32")).startswith(("int", "uint"))
    probe = torch.zeros((1, *shape), dtype=torch.int64 if is_integer else torch.float32, device="meta")
    plan = []
    for index, entry in enumerate(spec["layers"]):
        name, kwargs = _parse_entry(entry, index, where)
        if name not in table:
            raise ModelRefError(f"expected a layer type {_layer_type_hint(name, table)}, got {quote(name)} "
                                f"(layer {index})", where=where)
        constructor, infer = table[name]
        _check_arguments(name, constructor, kwargs, index, where)
        full = {**infer(tuple(probe.shape[1:])), **kwargs}
        try:
            with torch.device("meta"):
                probe = constructor(**dict(full))(probe)
        except Exception as error:  # noqa: BLE001 - shown as one line with the layer named
            raise ModelRefError(f"layer {index} ({name} {quote(kwargs)}) cannot take a sample of shape "
                                f"{list(probe.shape[1:])}: {type(error).__name__}: {one_line(error)}",
                                where=where) from None
        plan.append((name, full))
    return plan


# A layer spec is a page a person writes: 1,000 layers at ~60 bytes each is 60 KB. A larger file is
# not a spec, and reading it whole would be the first step of a memory attack.
MAX_SPEC_BYTES = 1 << 20
# Nesting a person writes is spec → layers → layer → arguments → a list of sizes: 5 levels. Deeper
# nesting is refused while the YAML is composed, before Python recursion could run out.
MAX_SPEC_DEPTH = 16


def _safe_yaml_loader():
    """PyYAML's SafeLoader without aliases and with bounded nesting. An alias (`*name`) reuses an
    anchored node; nesting aliases nine deep in 700 bytes expands to 10⁹ list items when the document
    is turned into Python objects (the "billion laughs"). A spec has no need for them, so the composer
    refuses the first alias event it sees, before anything is expanded."""
    import yaml

    class SpecLoader(yaml.SafeLoader):
        depth = 0

        def compose_node(self, parent, index):
            if self.check_event(yaml.AliasEvent):
                mark = self.peek_event().start_mark
                raise yaml.YAMLError(f"aliases (*name) are not allowed in a layer spec (line {mark.line + 1})")
            self.depth += 1
            if self.depth > MAX_SPEC_DEPTH:
                raise yaml.YAMLError(f"nesting deeper than {MAX_SPEC_DEPTH} levels")
            try:
                return super().compose_node(parent, index)
            finally:
                self.depth -= 1

    return SpecLoader


def _read_text(file: Path, path: str) -> str:
    with file.open("rb") as handle:
        data = handle.read(MAX_SPEC_BYTES + 1)
    if len(data) > MAX_SPEC_BYTES:
        raise ModelRefError(f"expected a layer spec of at most {MAX_SPEC_BYTES:,} bytes, got a larger file", where=path)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise ModelRefError(f"expected a UTF-8 text {file.suffix[1:].upper()} spec, got binary data", where=path) from None


def read_spec(path: str) -> dict[str, Any]:
    file = Path(path)
    if not file.is_file():
        raise ModelRefError(f"expected an existing spec file, got {quote(path)}", where="MODEL")
    text = _read_text(file, path)
    try:
        if file.suffix.lower() == ".json":
            spec = json.loads(text)
        else:
            try:
                import yaml
            except ImportError:
                raise ModelRefError("YAML specs need PyYAML: pip install 'trainmem[yaml]' (or use a .json spec)",
                                    where=path) from None
            spec = yaml.load(text, Loader=_safe_yaml_loader())  # noqa: S506 - a SafeLoader subclass
    except ModelRefError:
        raise
    except (ValueError, RecursionError, Exception) as error:  # json.JSONDecodeError, yaml.YAMLError
        raise ModelRefError(f"expected valid {file.suffix[1:].upper()}, got {type(error).__name__}: "
                            f"{one_line(error)}", where=path) from None
    _check_spec(spec, path)
    return spec


def _check_spec(spec: Any, where: str) -> None:
    if not isinstance(spec, dict):
        raise ModelRefError(f"expected a mapping with 'input' and 'layers', got {type(spec).__name__}", where=where)
    unknown = sorted(set(spec) - _TOP_KEYS)
    if unknown:
        raise ModelRefError(f"expected keys among {', '.join(sorted(_TOP_KEYS))}, got {quote(unknown[0])}", where=where)
    shape = spec.get("input")
    if not isinstance(shape, list) or not shape or not all(isinstance(d, int) and d > 0 for d in shape):
        raise ModelRefError(f"expected 'input' as a list of positive integers, got {quote(shape)}", where=where)
    if not isinstance(spec.get("layers"), list) or not spec["layers"]:
        raise ModelRefError(f"expected a non-empty 'layers' list, got {quote(spec.get('layers'))}", where=where)
    if len(spec["layers"]) > MAX_LAYERS:  # the mlp: reference's bound, for the same reason (frontends/mlp.py)
        raise ModelRefError(f"expected at most {MAX_LAYERS:,} layers in a spec, got {len(spec['layers']):,}",
                            where=where)


def _default_input(spec: dict[str, Any], plan: list[tuple[str, dict[str, Any]]]) -> InputSpec:
    dtype = str(spec.get("input_dtype", "float32"))
    vocab = next((kw.get("num_embeddings") for name, kw in plan if name == "embedding"), 2)
    return InputSpec(tuple(spec["input"]), dtype, int(spec.get("input_max", vocab)))


def _spec_loss(value: Any, where: str) -> Loss:
    try:
        return Loss(str(value).lower())
    except ValueError:
        raise ModelRefError(f"expected loss among {', '.join(l.value for l in Loss)}, got {quote(value)}",
                            where=where) from None


def from_spec_file(path: str):
    from trainmem.frontends import ModelSource

    spec = read_spec(path)
    plan = _plan_layers(spec, path)
    table = _layer_table()

    def build():
        nn = _nn()
        return nn.Sequential(*[table[name][0](**dict(kwargs)) for name, kwargs in plan])

    loss = _spec_loss(spec.get("loss", "cross-entropy"), path)
    return ModelSource(ref=path, name=spec.get("name", Path(path).stem), build=build,
                       default_inputs=(_default_input(spec, plan),), default_loss=loss)
