"""`torchvision:NAME` and `timm:NAME`, with constructor keywords after `?`:
`timm:vit_base_patch16_224?num_classes=10`, `torchvision:resnet50?num_classes=100&width_per_group=32`.

Models are built without weights (weights=None, pretrained=False) under the meta device. A few
constructors compute layer widths with real arithmetic on tensors (torchvision's RegNet calls
`.tolist()` in `BlockParams.from_init_params`), which meta tensors cannot answer; those are built on
the CPU inside accelerate's init_empty_weights, which moves every parameter to meta as it is
registered, so no weight is held for real (buffers such as batch-norm statistics are, briefly).

The input is the size the model's pretrained weights expect (torchvision's weights transforms,
timm's pretrained_cfg), 3×224×224 when neither says. Needs `pip install 'trainmem[vision]'`, with the
torchvision paired with the installed torch (install_hints.py).
"""

from __future__ import annotations

from typing import Any

from trainmem.errors import ModelRefError
from trainmem.setup import InputSpec

DEFAULT_IMAGE = (3, 224, 224)


def _parse_value(text: str) -> Any:
    for convert in (int, float):
        try:
            return convert(text)
        except ValueError:
            pass
    return {"true": True, "false": False, "none": None}.get(text.lower(), text)


def parse_ref(ref: str) -> tuple[str, str, dict[str, Any]]:
    """'timm:vit_base_patch16_224?num_classes=10' -> ('timm', 'vit_base_patch16_224', {'num_classes': 10})."""
    library, _, rest = ref.partition(":")
    name, _, query = rest.partition("?")
    kwargs: dict[str, Any] = {}
    for part in filter(None, query.split("&")):
        key, sep, value = part.partition("=")
        if not sep or not key:
            raise ModelRefError(f"expected constructor keywords as key=value&key=value after '?', got {part!r}",
                                where="MODEL")
        kwargs[key.strip()] = _parse_value(value.strip())
    if not name:
        raise ModelRefError(f"expected {library}:MODEL_NAME, got {ref!r}", where="MODEL")
    return library, name.strip(), kwargs


def _import(library: str):
    try:
        return __import__(library)
    except ImportError:
        from trainmem.install_hints import vision_hint

        raise ModelRefError(f"expected {library} for {library}: references; {vision_hint()}", where="MODEL") from None


def _torchvision_input(name: str, kwargs: dict[str, Any]) -> tuple[int, ...]:
    torchvision = _import("torchvision")
    if "image_size" in kwargs:
        return (3, kwargs["image_size"], kwargs["image_size"])
    try:
        # the smallest crop among the published weights: weights=None builds the model's default size,
        # and larger crops belong to weights that also change the model (vit_h_14's SWAG E2E at 518)
        crops = [w.transforms().crop_size[0] for w in torchvision.models.get_model_weights(name)]
        return (3, min(crops), min(crops)) if crops else DEFAULT_IMAGE
    except (ValueError, AttributeError, KeyError, TypeError):
        return DEFAULT_IMAGE


def _timm_input(name: str, kwargs: dict[str, Any]) -> tuple[int, ...]:
    timm = _import("timm")
    if "img_size" in kwargs:
        size = kwargs["img_size"]
        return (kwargs.get("in_chans", 3), *(size if isinstance(size, tuple) else (size, size)))
    config = timm.get_pretrained_cfg(name) if hasattr(timm, "get_pretrained_cfg") else None
    size = getattr(config, "input_size", None) if config is not None else None
    return tuple(size) if size else DEFAULT_IMAGE


def _build(library: str, name: str, kwargs: dict[str, Any]):
    module = _import(library)
    if library == "torchvision":
        if name not in module.models.list_models():
            raise ModelRefError(f"expected a torchvision model name (torchvision.models.list_models()), got {name!r}",
                                where="MODEL")
        return lambda: module.models.get_model(name, weights=None, **kwargs)
    if not module.is_model(name):
        raise ModelRefError(f"expected a timm model name (timm.list_models()), got {name!r}", where="MODEL")
    return lambda: module.create_model(name, pretrained=False, **kwargs)


def _empty_weights():
    try:
        from accelerate import init_empty_weights
    except ImportError:
        return None
    # include_buffers=True would build under the meta device again; buffers (batch-norm statistics)
    # are small and are replaced by fake tensors like everything else before the trace
    return init_empty_weights(include_buffers=False)


def from_vision_ref(ref: str):
    import torch

    from trainmem.frontends import ModelSource

    library, name, kwargs = parse_ref(ref)
    construct = _build(library, name, kwargs)
    shape = _torchvision_input(name, kwargs) if library == "torchvision" else _timm_input(name, kwargs)

    def build():
        try:
            return construct()
        except (NotImplementedError, RuntimeError) as error:
            if "meta" not in str(error):
                raise
            empty = _empty_weights()
            if empty is None:
                from trainmem.install_hints import vision_install

                raise ModelRefError(f"{library}:{name} computes with tensors while it is built, which needs "
                                    f"accelerate ({vision_install()})", where="MODEL") from None
            with torch.device("cpu"), empty:
                return construct()

    return ModelSource(ref=ref, name=f"{library}:{name}", build=build,
                       default_inputs=(InputSpec(tuple(int(d) for d in shape)),),
                       libraries=("torchvision",) if library == "torchvision" else ("torchvision", "timm"),
                       notes=(f"{library}:{name} built without weights; input {'×'.join(map(str, shape))} "
                              "per sample (the size its pretrained weights expect)",))
