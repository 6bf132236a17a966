"""How oneDNN's backward-weights kernels split their work across threads.

Backward-weights reduces over the minibatch (and output rows). When the `balance` of a kernel
gives more than one thread to the minibatch, every extra thread accumulates into a private copy
of the weight (and bias) gradient in f32, booked in the scratchpad; so the scratchpad of a
backward pass depends on the thread count, and these functions are where it enters. Each mirrors
the function its docstring names, in oneDNN v3.12 (torch 2.13).
"""

from __future__ import annotations

from trainmem.targets.onednn.conv_geometry import ConvGeometry
from trainmem.targets.onednn.scratchpad import BARRIER_BYTES, F32_BYTES, PAGE_BYTES, book, div_up, round_up


def jit_minibatch_threads(geometry: ConvGeometry, ic_block: int, oc_block: int, ic_blocks: int,
                          oc_blocks: int, threads: int) -> int:
    """jit_avx512_common_conv_bwd_weights_kernel_f32::balance: the threads given to the minibatch (nthr_mb)."""
    if threads < geometry.groups:
        return 1
    group_threads = geometry.groups
    per_group = threads // group_threads
    three_d = geometry.spatial_dims == 3
    # harness_2d_reduction: 2d, undilated, more than 9 output rows reduce over the rows as well
    rows_reduced = (geometry.spatial_dims == 2 and all(step == 1 for step in geometry.dilation)
                    and geometry.out_spatial[0] > 9)
    in_h, out_h = geometry.in_spatial[-2], geometry.out_spatial[-2]
    in_w, out_w = geometry.in_spatial[-1], geometry.out_spatial[-1]
    in_d = geometry.in_spatial[0] if three_d else 1
    out_d = geometry.out_spatial[0] if three_d else 1
    in_h_reduced, out_h_reduced = (in_h, out_h) if rows_reduced else (1, 1)
    in_h_kept, out_h_kept = (1, 1) if rows_reduced else (in_h, out_h)
    row_reduce_threads = max(1, out_h_reduced // 9)
    kernel_h, kernel_w = geometry.kernel[-2], geometry.kernel[-1]
    kernel_d = geometry.kernel[0] if three_d else 1
    stride_d = geometry.stride[0] if three_d else 1
    stride_h, stride_w = geometry.stride[-2], geometry.stride[-1]
    batch, groups = geometry.batch, geometry.groups

    def memory_cost(mb_threads: int, oc_threads: int, ic_threads: int) -> int:
        return (div_up(batch * in_h_reduced, mb_threads) * div_up(groups, group_threads)
                * div_up(ic_blocks, ic_threads) * ic_block * in_h_kept * in_w * in_d
                // stride_d // stride_h // stride_w
                + div_up(batch * out_h_reduced, mb_threads) * div_up(groups, group_threads)
                * div_up(oc_blocks, oc_threads) * oc_block * out_h_kept * out_w * out_d
                + 8 * div_up(groups, group_threads) * div_up(oc_blocks, oc_threads) * div_up(ic_blocks, ic_threads)
                * kernel_h * kernel_w * kernel_d * ic_block * oc_block)

    def compute_cost(mb_threads: int, oc_threads: int, ic_threads: int) -> int:
        return (div_up(batch * out_h_reduced, mb_threads) * div_up(groups, group_threads)
                * div_up(oc_blocks, oc_threads) * div_up(ic_blocks, ic_threads))

    def splits():
        for mb_threads in range(1, min(per_group, batch * out_d * row_reduce_threads) + 1):
            left = per_group // mb_threads
            for oc_threads in range(1, min(left, oc_blocks) + 1):
                yield mb_threads, oc_threads, min(left // oc_threads, ic_blocks)

    best = (1, 1, 1)
    best_memory = memory_cost(*best)
    for split in splits():  # the split that moves the least memory...
        cost = memory_cost(*split)
        if cost <= best_memory:
            best_memory, best = cost, split
    best_compute = compute_cost(*best)
    for split in splits():  # ...traded for less compute per thread at up to 10% more memory
        memory, compute = memory_cost(*split), compute_cost(*split)
        if (compute <= best_compute and memory < 1.1 * best_memory) or 4 * compute <= 3 * best_compute:
            best_compute, best = compute, split
    minibatch_threads = best[0]
    if threads // 2 < minibatch_threads < threads:
        minibatch_threads = min(batch * out_d * row_reduce_threads, threads)
    return minibatch_threads


def reducer_scratchpad(threads: int, job: int, jobs: int, reduction: int, max_buffer: int | None = None) -> int:
    """cpu_reducer_t<f32> scratch (reduce_balancer_t::balance + conf_t::init_scratchpad): `jobs`
    jobs of `job` floats each, reduced over `reduction`. max_buffer: threads*3*5*5*16*16 for the
    avx512 kernels, 1 << 21 for jit:avx2."""
    if max_buffer is None:
        max_buffer = threads * 3 * 5 * 5 * 16 * 16
    min_jobs_per_group = max(1, jobs // threads)
    max_jobs_per_group = max(1, max_buffer // (threads * job))
    groups = min(jobs // min_jobs_per_group, threads)
    threads_per_group = min(threads // groups, reduction)
    jobs_per_group = div_up(jobs, groups)
    best = jobs * job * reduction
    for candidate in range(min_jobs_per_group, jobs):
        candidate_groups = min(jobs // candidate, threads)
        candidate_threads = min(threads // candidate_groups, reduction)
        candidate_jobs = div_up(jobs, candidate_groups)
        if candidate_threads > 1 and candidate_jobs > max_jobs_per_group:
            continue
        cost = job * candidate_jobs * (div_up(reduction, candidate_threads) + (candidate_threads != 1))
        if cost < best:
            groups, threads_per_group, jobs_per_group, best = (candidate_groups, candidate_threads,
                                                               candidate_jobs, cost)
    if threads_per_group == 1:
        return 0
    return (book(groups * (threads_per_group - 1) * jobs_per_group * job * F32_BYTES, PAGE_BYTES)
            + book(groups * BARRIER_BYTES))


def best_divider(value: int, low: int, high: int, find_max: bool) -> int:
    """oneDNN's `best_divider`: the divider in [low, high] that pads `value` least."""
    high = max(1, min(high, value))
    low = max(1, min(low, high))
    best_loss, divider = float("inf"), high
    for candidate in range(high, low - 1, -1):
        loss = (round_up(value, candidate) - value) / round_up(value, candidate)
        if (find_max and loss < best_loss) or (not find_max and loss <= best_loss):
            best_loss, divider = loss, candidate
    return divider


def pointwise_minibatch_threads(geometry: ConvGeometry, block: int, threads: int) -> int:
    """jit_avx512_common_1x1_conv_kernel::balance: the threads given to the minibatch (nthr_mb)."""
    if threads < geometry.groups:
        return 1
    out_points = geometry.out_points
    reduce_block = best_divider(out_points, 7, 16, True)
    broadcast_blocks = div_up(geometry.in_per_group, block)
    load_blocks = div_up(geometry.out_per_group, block)
    reduce_blocks = div_up(out_points, reduce_block)
    per_group = threads // geometry.groups
    stride_h, stride_w = geometry.stride[-2], geometry.stride[-1]
    batch = geometry.batch

    def memory_cost(mb_threads: int, load_threads: int, broadcast_threads: int) -> int:
        return (div_up(batch * reduce_blocks, mb_threads) * div_up(broadcast_blocks, broadcast_threads)
                * block * reduce_block // stride_h // stride_w
                + div_up(batch * reduce_blocks, mb_threads) * div_up(load_blocks, load_threads) * block * reduce_block
                + 12 * div_up(load_blocks, load_threads) * div_up(broadcast_blocks, broadcast_threads) * block * block)

    best, best_memory = (1, 1, 1), memory_cost(1, 1, 1)
    for mb_threads in range(1, min(per_group, batch * reduce_blocks) + 1):
        left = per_group // mb_threads
        for load_threads in range(1, min(left, load_blocks) + 1):
            split = (mb_threads, load_threads, min(left // load_threads, broadcast_blocks))
            cost = memory_cost(*split)
            if cost <= best_memory:
                best_memory, best = cost, split
    minibatch_threads = best[0]
    if threads // 2 < minibatch_threads < threads:
        minibatch_threads = min(batch, threads)
    return minibatch_threads
