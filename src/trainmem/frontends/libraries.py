"""The libraries a model is built from, whose import the CPU process model adds to the training process.

A training process holds, beside torch, the libraries its model comes from: a transformers model's process has
transformers imported and in use, a LightningModule's has Lightning. targets/data/cpu_runtime.json holds their
measured resident memory (benchmarks/calibrate_cpu.py's import sets). A reference names its own (hf: brings
transformers, timm: brings timm and torchvision); a factory file, a module object or a training script's live model
is read here, from the classes its modules are instances of: a library counts when one of them is defined in it or
derives from a class defined in it. Being imported is not enough: `import lightning` imports transformers, whose
calibrated increment is that of a process training a transformers model.
"""

from __future__ import annotations

from typing import Any

# the libraries targets/data/cpu_runtime.json has increments for (benchmarks/calibrate_cpu.py IMPORT_SETS)
PROCESS_LIBRARIES = ("lightning", "peft", "timm", "torchvision", "transformers")


def model_libraries(model: Any) -> tuple[str, ...]:
    """The PROCESS_LIBRARIES that define a class of one of `model`'s modules or one it derives from."""
    found = {cls.__module__.split(".")[0] for module in model.modules() for cls in type(module).__mro__}
    return tuple(name for name in PROCESS_LIBRARIES if name in found)


def code_libraries(model: Any) -> tuple[str, ...]:
    """The PROCESS_LIBRARIES whose code runs between the model's ops: those that define one of its modules' own
    classes. A plain model wrapped by peft is peft's, though PeftModel derives from a transformers mixin (which
    model_libraries counts: the process imports transformers all the same)."""
    found = {type(module).__module__.split(".")[0] for module in model.modules()}
    return tuple(name for name in PROCESS_LIBRARIES if name in found)
