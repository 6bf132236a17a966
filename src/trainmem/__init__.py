"""trainmem: how much memory will training take — before you train."""

from trainmem._version import __version__
from trainmem.compare import Comparison, compare
from trainmem.devices import Device
from trainmem.errors import TrainmemError
from trainmem.estimate import Estimate, estimate
from trainmem.fit import FitResult, fit
from trainmem.integrations.guard import DoesNotFit, find_batch_size, guard
from trainmem.plan import PlanResult, plan
from trainmem.setup import InputSpec, Loss, Optimizer, OptimizerImpl, Precision, TrainingSetup
from trainmem.setup.layout import ParallelLayout
from trainmem.setup.target_options import TargetOptions
from trainmem.sweep_result import SweepResult
from trainmem.sweep import compare_setups, sweep  # noqa: E402 - after the result type; `trainmem.sweep` is the function

__all__ = [
    "Comparison",
    "Device",
    "DoesNotFit",
    "Estimate",
    "FitResult",
    "InputSpec",
    "Loss",
    "Optimizer",
    "OptimizerImpl",
    "ParallelLayout",
    "PlanResult",
    "Precision",
    "SweepResult",
    "TargetOptions",
    "TrainingSetup",
    "TrainmemError",
    "__version__",
    "compare",
    "compare_setups",
    "estimate",
    "find_batch_size",
    "fit",
    "guard",
    "plan",
    "sweep",
]
