"""How the target device runs the training, beside what the training is (TrainingSetup): the CUDA stack's
settings and TensorFlow's. One frozen value for estimate(), fit() and sweep(), built the same from CLI flags
and Python; each option is checked where it is used (the target's `create`, targets/), so a bad value fails
before anything is traced. No torch."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, ClassVar

from trainmem.errors import SetupError


@dataclasses.dataclass(frozen=True)
class TargetOptions:
    """None everywhere means the defaults: the catalog's CUDA context, PyTorch's allocator defaults, the CUDA
    version of the installed torch, its module loading and cuDNN setting, TensorFlow's own memory mode and
    its own oneDNN decision."""

    cuda_context: int | None = None  # bytes of the CUDA context (overrides the catalog's figure)
    alloc_conf: str | None = None  # a PYTORCH_CUDA_ALLOC_CONF string ("expandable_segments:True")
    cuda_version: str | None = None  # the target run's CUDA ("12.4")
    module_loading: str | None = None  # CUDA_MODULE_LOADING: "lazy" or "eager"
    cudnn_benchmark: bool | None = None  # torch.backends.cudnn.benchmark
    tf_memory: str | None = None  # TensorFlow's GPU memory mode ("default", "growth", "limit:8GiB", "fraction:0.5")
    tf_onednn: str | None = None  # TensorFlow's oneDNN on the CPU: "auto", "on" or "off"
    # samples of the numpy arrays model.fit trains on (Keras on TensorFlow, CPU: the dataset is part of peak RSS);
    # None: as many steps as are traced, times the batch
    dataset_size: int | None = None

    # the options of PyTorch's CUDA target (targets/cuda_target.py CudaTarget.create takes them as keywords)
    CUDA_KEYS: ClassVar[tuple[str, ...]] = ("cuda_context", "alloc_conf", "cuda_version", "module_loading",
                                            "cudnn_benchmark")
    TF_KEYS: ClassVar[tuple[str, ...]] = ("tf_memory", "tf_onednn", "dataset_size")

    @classmethod
    def keys(cls) -> tuple[str, ...]:
        return cls.CUDA_KEYS + cls.TF_KEYS

    @classmethod
    def of(cls, given: TargetOptions | Mapping[str, Any] | None, where: str) -> TargetOptions:
        """`given` as TargetOptions: itself, the defaults for None, or built from a mapping of its keys."""
        if given is None:
            return cls()
        if isinstance(given, TargetOptions):
            return given
        if not isinstance(given, Mapping):
            raise SetupError(f"expected target_options= as a trainmem.TargetOptions (or a dict of its keys), got "
                             f"{type(given).__name__}", where=where)
        unknown = sorted(set(given) - set(cls.keys()))
        if unknown:
            raise SetupError(f"expected target options among {', '.join(cls.keys())}, got {', '.join(unknown)}",
                             where=where)
        return cls(**dict(given))

    def cuda(self) -> dict[str, Any]:
        """The CUDA target's keywords, every one of them (None: its default)."""
        return {key: getattr(self, key) for key in self.CUDA_KEYS}

    def cuda_only(self, where: str) -> dict[str, Any]:
        """The CUDA target's keywords, for a caller of PyTorch models only (fit()): a TensorFlow option is refused."""
        tf = [key for key in self.TF_KEYS if getattr(self, key) is not None]
        if tf:
            raise SetupError(f"expected no TensorFlow option for {where} (it takes PyTorch models), got {', '.join(tf)}",
                             where=where)
        return self.cuda()

    def with_values(self, **values: Any) -> TargetOptions:
        return dataclasses.replace(self, **values)


def refuse_loose_options(values: Mapping[str, Any], where: str) -> None:
    """A target option given as a loose keyword (estimate(..., cuda_context=…), as before TargetOptions) is
    refused in one line that says where it goes now, rather than read as an unknown setup key."""
    loose = [key for key in TargetOptions.keys() if key in values]
    if loose:
        shown = ", ".join(f"{key}=…" for key in loose)
        raise SetupError(f"expected target_options=TargetOptions({shown}) for how the target runs, got "
                         f"{', '.join(loose)} as setup keywords", where=where)
