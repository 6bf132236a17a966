"""--compile: the training step as `torch.compile` runs it, with Inductor, its default backend.

A compiled forward keeps different tensors for backward than the eager one, and allocates different temporaries:
AOTAutograd traces forward and backward into one joint graph, its min-cut partitioner chooses what the forward
saves (cheap pointwise results are recomputed in backward instead of saved), and Inductor fuses chains of
pointwise ops and reductions into kernels whose intermediates never exist as tensors, converts convolution inputs
to channels-last, and frees and reuses buffers by its own plan. No formula over the eager trace gives that.

So the trace compiles for real: `compile_forward` wraps the model's forward in torch.compile, for the real run
and the trace alike, and the trace runs inside `compiled_on_fake`, where dynamo, AOTAutograd and Inductor work on
the fake tensors as they do on a user's, and the wrapper Inductor writes runs with its C++ kernels unbuilt
(trace/inductor_private.py): every buffer it allocates, keeps and frees is a recorded allocation of the size
Inductor chose. What falls outside the compiled forward (the loss, the optimizer step, zero_grad) stays eager,
as in the user's run. The recorder's dispatch modes stand aside while dynamo and Inductor compile
(`ignore_compile_internals`, read from `compiled_trace_active`) and see the compiled code's ops when it runs;
the module tracker's hooks do nothing while dynamo traces them, so the compiled forward's allocations belong to
the model as a whole, as its kernels do.

Inductor plans for the device of the tensors it is given. The fake trace runs on the CPU, so its plan is the
CPU's (C++ kernels); a CUDA run's plan is Triton's, which this does not make, and --compile is refused for GPU
targets (flag_rules). Dynamo's caches are reset before and after the trace: before, so that each trace compiles
for its own shapes as a fresh process does (no recompile limit, no dynamic shapes from an earlier batch size);
after, so that no compiled code with unbuilt kernels is left for a real torch.compile in the same process.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

import torch

from trainmem.errors import SetupError, TraceError, TorchVersionError

# TorchDispatchMode.ignore_compile_internals came in 2.9 (August 2025), but on torch 2.10.0 dynamo still ran the traced
# forward eagerly under the trace's modes (make compat, 2026-12-06); 2.11.0, 2.12.1, 2.13.0 and 2.15.0 compile it.
# 2.9 was not run, so 2.11 is the first release known to work
MIN_TORCH = "2.11"
_ACTIVE = [False]  # whether a --compile trace is running: the dispatch modes' ignore_compile_internals

NOTE = ("--compile: the forward traced as torch.compile (Inductor) compiles it on the CPU: the tensors its "
        "partitioner saves for backward, its fused kernels' buffers and its frees; per-module rows cannot look inside "
        "the compiled forward (its allocations are the model's)")


def compiled_trace_active() -> bool:
    return _ACTIVE[0]


def traceable_here() -> bool:
    """Whether this torch lets the trace see compiled code run: TorchDispatchMode.ignore_compile_internals (torch
    2.9, pytorch/pytorch PR 161648; before it, dynamo runs nothing compiled while a dispatch mode is active), on a
    release at least MIN_TORCH."""
    from trainmem.trace.torch_private import TorchDispatchMode, torch_release

    return hasattr(TorchDispatchMode, "ignore_compile_internals") and torch_release() >= torch_release(MIN_TORCH)


def check_traceable(setup: Any, cuda_target: bool) -> None:
    """Refuse, in one line, a --compile run the trace does not make (the CLI's flag rules say the same earlier, naming
    where each option came from; this holds for the Python API and the integrations). Called before the model is traced."""
    if not traceable_here():
        raise TorchVersionError(f"--compile needs torch >= {MIN_TORCH} (this is torch {torch.__version__}; compiled code "
                                f"runs inside the trace from torch {MIN_TORCH} on)")
    if cuda_target:
        raise SetupError("expected --device cpu with --compile (the trace makes the plan Inductor makes for the CPU; "
                         "a GPU run's Triton plan is not modelled yet), got a GPU target", where="--compile")
    if setup.checkpointing:
        raise SetupError("expected no --checkpointing with --compile (a checkpointed block compiled by Inductor runs "
                         "higher-order operators the trace does not take yet), got it on", where="--compile")
    if setup.parallel.distributed:
        raise SetupError(f"expected a one-process run with --compile, got --strategy {setup.parallel.strategy} "
                         f"over {setup.parallel.world_size} ranks", where="--compile")


def compile_forward(model: torch.nn.Module) -> None:
    """What a user's `model = torch.compile(model)` does to the step: forward runs compiled (lazily, at the first
    call); the module, its parameters and the optimizer stay the same objects."""
    model.forward = torch.compile(model.forward)


@contextlib.contextmanager
def compiled_on_fake() -> Iterator[None]:
    """Around the traced steps of a --compile trace (the module docstring); check_traceable has passed."""
    from trainmem.trace.inductor_private import inductor_plans_on_fake

    _import_cpp_extension()
    torch.compiler.reset()
    try:
        with inductor_plans_on_fake() as loads:
            _ACTIVE[0] = True
            try:
                yield
            finally:
                _ACTIVE[0] = False
    finally:
        torch.compiler.reset()
    if loads.count == 0:
        # dynamo compiled nothing (it skipped the forward), so the step ran eagerly and would be estimated as eager
        raise TraceError(f"expected torch.compile to compile the forward inside the trace, got it run eagerly on "
                         f"torch {torch.__version__} (the trace needs TorchDispatchMode.ignore_compile_internals)",
                         where="--compile")


def _import_cpp_extension() -> None:
    """Import torch.utils.cpp_extension, which Inductor's C++ backend imports (and with it setuptools) the first time
    it picks a vector ISA. On Python before 3.12, setuptools' distutils shim (_distutils_hack) turns itself off for
    good once anything in the process has looked `pip` up (its spec_for_pip, pypa/pip#8761), and `import setuptools`
    then fails with an AssertionError naming the standard library's distutils. Where that happened, setuptools is
    imported over the standard library's distutils, which is what SETUPTOOLS_USE_DISTUTILS=stdlib asks for."""
    try:
        import torch.utils.cpp_extension  # noqa: F401
    except AssertionError as error:
        if "distutils" not in str(error):
            raise
        before = os.environ.get("SETUPTOOLS_USE_DISTUTILS")
        os.environ["SETUPTOOLS_USE_DISTUTILS"] = "stdlib"
        try:
            import torch.utils.cpp_extension  # noqa: F401, F811
        finally:
            if before is None:
                del os.environ["SETUPTOOLS_USE_DISTUTILS"]
            else:
                os.environ["SETUPTOOLS_USE_DISTUTILS"] = before
