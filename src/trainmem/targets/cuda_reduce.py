"""The global-memory buffer of PyTorch's CUDA reductions (sum, mean): what gpu_reduce_kernel allocates below
the dispatcher when one output's inputs are split across thread blocks.

aten/src/ATen/native/cuda/Reduce.cuh: `setReduceConfig` picks the launch; when a thread would still sum 256 or
more values and the grid leaves SMs idle, it splits each output's inputs over `ctas_per_output` blocks, which
then need a staging buffer (`global_memory_size()`: accumulator bytes × outputs × ctas_per_output, × block.x ×
output_vec_size when the block does not reduce along x) and one semaphore per output block (`semaphore_size()`:
4 bytes × grid.x). `gpu_reduce_kernel` takes both from the caching allocator right after the output and frees
them when the launch is queued. A bias gradient is such a reduction: `grad.sum(0)` over batch × sequence rows.
Measured on an H200 (torch 2.11, benchmarks/data/memory_history/history_mlp8192.pickle): the bias gradient of
Linear(8192, 8192) at batch 8192 allocated 138,412,032 + 256 bytes there, which the rules below reproduce
(ctas_per_output 33 = ceil(132 SMs × 16 blocks / 64 blocks)).

The split depends on the GPU's SM count and resident threads per SM (`target_grid_size`); a GPU the table does
not know (a custom: device) is sized with the largest split the rules allow whatever the GPU (never low).
Only contiguous inputs are sized exactly; others take the larger of the two launch shapes.
"""

from __future__ import annotations

import dataclasses
import math

from trainmem.trace.events import KernelCall, TensorMeta

REDUCE_OPS = frozenset({"sum", "mean"})

# Reduce.cuh: mnt_wrapper<T>::MAX_NUM_THREADS (512 but for complex<double>), the input vector width, the thread
# work bounds of setReduceConfig
_MAX_NUM_THREADS = 512
_INPUT_VEC_SIZE = 4
_WARP_SIZE = 32
_MIN_VALUES_PER_THREAD, _MAX_VALUES_PER_THREAD = 16, 256

# CUDA C++ Programming Guide, "Technical Specifications per Compute Capability": maximum resident threads per SM
_THREADS_PER_SM = {(7, 0): 2048, (7, 5): 1024, (8, 0): 2048, (8, 6): 1536, (8, 7): 2048, (8, 9): 1536,
                   (9, 0): 2048, (10, 0): 2048, (12, 0): 1536}
# SMs per GPU of the catalog (devices.py), from NVIDIA's architecture whitepapers and product briefs
SM_COUNTS = {"v100-16gb": 80, "v100-32gb": 80, "v100-sxm2-32gb": 80, "t4": 40, "a10g": 80, "a40": 84, "l4": 58,
             "l40s": 142, "a100-40gb": 108, "a100-80gb": 108, "h100-80gb": 132, "h100-pcie": 114, "h100-nvl": 132,
             "h200": 132, "b200": 148, "gb200": 148, "rtx3090": 82, "rtx4090": 128, "rtx-a6000": 84,
             "rtx-6000-ada": 142, "rtx5090": 170}


@dataclasses.dataclass(frozen=True)
class GridFacts:
    """What setReduceConfig reads of the device; None: unknown (the largest split is assumed)."""

    sms: int | None
    threads_per_sm: int | None

    @classmethod
    def of(cls, name: str, compute_capability: tuple[int, int]) -> GridFacts:
        return cls(SM_COUNTS.get(name), _THREADS_PER_SM.get(tuple(compute_capability)))


def _last_pow2(n: int) -> int:
    return 1 << (max(1, n).bit_length() - 1)


def _div_up(a: int, b: int) -> int:
    return -(-a // b)


def reduce_buffer_bytes(call: KernelCall, grid: GridFacts) -> int:
    """Bytes of gpu_reduce_kernel's staging buffer plus semaphores for one sum/mean call (0: none)."""
    source = call.args[0] if call.args else None
    if not isinstance(source, TensorMeta) or not source.shape or math.prod(source.shape) == 0:
        return 0
    reduced = _reduced_dims(call, len(source.shape))
    groups = _coalesced(source.shape, reduced)
    accumulator = 8 if source.dtype in ("float64", "complex64") else 4
    if not source.contiguous:  # the launch shape follows the strides, which the trace does not keep
        return max(_buffer(groups, accumulator, grid, fastest) for fastest in (True, False))
    return _buffer(groups, accumulator, grid, None)


def _reduced_dims(call: KernelCall, ndim: int) -> set[int]:
    dims = call.args[1] if len(call.args) > 1 else None
    if dims is None or isinstance(dims, TensorMeta) or (isinstance(dims, (list, tuple)) and not dims):
        return set(range(ndim))  # sum(x), sum(x, dtype=...): every dimension
    dims = dims if isinstance(dims, (list, tuple)) else [dims]
    return {int(d) % ndim for d in dims if isinstance(d, int)}


def _coalesced(shape: tuple[int, ...], reduced: set[int]) -> list[tuple[int, bool, int]]:
    """(size, reduced, stride in elements) of a contiguous tensor's dims, innermost first, size-1 dims dropped
    and neighbours of the same kind merged, as TensorIterator coalesces them."""
    groups: list[tuple[int, bool, int]] = []
    stride = 1
    for dim in reversed(range(len(shape))):
        size = shape[dim]
        if size == 1:
            continue
        kind = dim in reduced
        if groups and groups[-1][1] == kind:
            first_size, _, first_stride = groups[-1]
            groups[-1] = (first_size * size, kind, first_stride)
        else:
            groups.append((size, kind, stride))
        stride *= size
    return groups


def _buffer(groups: list[tuple[int, bool, int]], accumulator: int, grid: GridFacts, fastest: bool | None) -> int:
    reduce_groups = [g for g in groups if g[1]]
    kept_groups = [g for g in groups if not g[1]]
    if not reduce_groups:
        return 0
    num_outputs = math.prod(g[0] for g in kept_groups)
    inputs_per_output = math.prod(g[0] for g in reduce_groups)
    if fastest is None:  # TensorIterator puts the reduced dims first, innermost first
        fastest = not kept_groups or reduce_groups[0][2] < kept_groups[0][2]
    vectorize_output = 1
    if fastest:
        dim0, dim1 = inputs_per_output, num_outputs
        if reduce_groups[0][2] == 1 and dim0 > 128 and len(reduce_groups) == 1:
            dim0 //= _INPUT_VEC_SIZE  # "vectorize along input"
    else:
        dim0, dim1 = num_outputs, inputs_per_output
        if kept_groups[0][2] == 1:  # "vectorize along output" (get_output_vec_size; data assumed 16-B aligned)
            vectorize_output = 4
            strides = [g[2] for g in reduce_groups] + [g[2] for g in kept_groups[1:]]
            while kept_groups[0][0] % vectorize_output or any(s % vectorize_output for s in strides):
                vectorize_output //= 2
            dim0 //= vectorize_output
    max_threads = _MAX_NUM_THREADS // vectorize_output
    dim0_pow2 = _last_pow2(dim0) if dim0 < max_threads else max_threads
    dim1_pow2 = _last_pow2(dim1) if dim1 < max_threads else max_threads
    block_width = min(dim0_pow2, _WARP_SIZE)
    block_height = min(dim1_pow2, max_threads // block_width)
    block_width = min(dim0_pow2, max_threads // block_height)
    step_input = step_output = 1
    if fastest:
        step_input *= block_width
    else:
        step_output *= block_width
    values = _div_up(inputs_per_output, step_input)
    if values < min(block_height * 16, _MAX_VALUES_PER_THREAD):
        return 0  # each warp takes its own outputs: no split across warps, so none across blocks
    step_input *= block_height
    values = _div_up(inputs_per_output, step_input)
    grid_x = _div_up(num_outputs // vectorize_output, step_output)
    ctas = _ctas_per_output(values, grid_x, block_width * block_height, grid)
    if values < _MAX_VALUES_PER_THREAD or ctas is None or ctas <= 1:
        return 0
    size = accumulator * num_outputs * ctas * (1 if fastest else block_width * vectorize_output)
    return size + 4 * grid_x


def _ctas_per_output(values: int, grid_x: int, threads: int, grid: GridFacts) -> int | None:
    """setReduceConfig's split; None where the grid already fills the GPU. An unknown GPU takes the largest."""
    by_work = _div_up(values, _MIN_VALUES_PER_THREAD)
    at_least = _div_up(values, _MAX_VALUES_PER_THREAD)
    if grid.sms is None or grid.threads_per_sm is None:
        return max(by_work, at_least)
    target = grid.sms * (grid.threads_per_sm // threads)
    if grid_x > target:
        return None
    return max(min(_div_up(target, grid_x), by_work), at_least)
