"""GPU memory that NCCL's communicators hold in each training process: outside PyTorch's caching allocator, so
absent from memory_allocated/memory_reserved, present in nvidia-smi's per-process figure. No torch here.

The mechanism (NCCL's source and maintainers):
- One communicator per process group the rank uses (torch creates each group's communicator on its first
  collective); every communicator has its own buffers unless made by ncclCommSplit with resource sharing
  (NVIDIA/nccl#986, sjeaugey: "More communicators = more memory used"; "the memory usage is linearly tied to the
  number of channels").
- Per channel and per connected peer, a FIFO for each protocol (src/init.cc): LL = NCCL_LL_LINES_PER_THREAD ×
  NCCL_LL_MAX_NTHREADS × NCCL_STEPS × 16 B = 8 × 512 × 8 × 16 = 512 KiB; LL128 = NCCL_LL128_ELEMS_PER_THREAD ×
  NCCL_LL128_MAX_NTHREADS × NCCL_STEPS × 8 B = 120 × 640 × 8 × 8 = 4,800 KiB; Simple = NCCL_BUFFSIZE, default
  1 << 22 = 4 MiB ("DEFAULT_BUFFSIZE (1 << 22) /* 4MiB */"). 9,633,792 B together; with cuMem (the default since
  NCCL 2.19) each buffer is rounded to the 2 MiB allocation granularity: NCCL_DEBUG_SUBSYS=ALLOC on 8 × H100 shows
  allocations of 10,485,760 and 2,097,152 bytes per channel per peer (NVIDIA/nccl#1685).
- Collectives connect a ring (previous and next rank) and a tree on every channel (sjeaugey in #986: "Ring uses a
  limited amount of memory as it only has 2 connections regardless of the scale"); send/recv (pipeline
  parallelism) connects each peer on its own channels: 32 per pair on 8 × H100 (#1685).
- NVLink SHARP (Hopper with NVSwitch, src/transport/nvls.cc ncclNvlsBufferSetup): buffSize = nvlsChunkSize
  (128 KiB) × NCCL_STEPS (8); nvlsPerRankSize = nChannels × 2 × buffSize; nvlsTotalSize = nvlsPerRankSize × nHeads
  (the communicator's ranks on this node), with 16 NVLS channels by default.

Measured per communicator (the range): 388 MiB per extra group on an RTX 3060 (sgl-project/sglang#35538, 10 MiB with
NCCL_MAX_NCHANNELS=1); 544 MB for 2-rank and 688 MB for 3-4-rank groups on 4 × A100 with NVLink after a 4 MB
all-reduce (NVIDIA/nccl#964); 1.06 GB on 8 × H100 before the first all-to-all including the CUDA context, 4.34 GB
after it (#1685: 3.28 GB for 7 peers × 32 channels, 14 MiB per channel per peer). This module returns the high end:
32 channels (as NCCL used for 8 × H100 peers in #1685) with ring and tree connections on each, and once per process
the fixed cost measured below.

Measured here (benchmarks/nccl_memory_probe.py on one H200, torch 2.11.0+cu130, NCCL 2.28.9; the figures are in
benchmarks/data/nccl_memory_h200.json): the process's first communicator takes 180 MiB with NCCL_MAX_NCHANNELS=1
(NCCL's own device code and structures plus one channel) and 558 MiB by default; each further single-rank group
388-390 MiB, 10-12 MiB with one channel: 64 channels of 6 MiB. NCCL_BUFFSIZE=1 MiB changed nothing there (a rank
alone in its ring allocates no Simple FIFO). One GPU cannot hold two ranks of a communicator, so the multi-rank
per-peer figures above stay those reported; 64 channels for multi-rank communicators on Hopper would double
the per-communicator figure (not seen reported: the range's high end is kept at 32).
"""

from __future__ import annotations

import math
from typing import Any

from trainmem.setup.layout import ParallelLayout, Strategy

MIB = 1 << 20
GRANULE = 2 * MIB  # cuMem allocation granularity: the 10,485,760 / 2,097,152 B allocations of NVIDIA/nccl#1685
LL_BYTES = 8 * 512 * 8 * 16  # src/init.cc DEFAULT_LL_BUFFSIZE
LL128_BYTES = 120 * 640 * 8 * 8  # src/init.cc DEFAULT_LL128_BUFFSIZE
SIMPLE_BYTES = 1 << 22  # src/init.cc DEFAULT_BUFFSIZE, NCCL_BUFFSIZE's default (4 MiB)
RECV_BYTES = math.ceil((LL_BYTES + LL128_BYTES + SIMPLE_BYTES) / GRANULE) * GRANULE  # 10 MiB (#1685's ALLOC size)
SEND_BYTES = GRANULE  # the send side's small structures, one granule (#1685's 2,097,152 B allocations)
CHANNELS = 32  # channels per communicator on H100 NVLink (#1685's log: channels 00-31); the high end
COLL_CONNECTIONS = 2  # ring + tree on every channel (#986)
P2P_BYTES_PER_CHANNEL = 14 * MIB  # send/recv per channel per peer: 3.28 GB / (7 peers × 32 channels) (#1685)
FIRST_COMM_BYTES = 180 * MIB  # the process's first communicator with one channel, H200 NCCL 2.28.9 (measured above)
# A data-parallel user at world size 1 still calls init_process_group("nccl") and its wrapper runs collectives on
# the one-rank group: the process's first (and only) communicator, measured by the probe above (defaults row of
# benchmarks/data/nccl_memory_h200.json: after_init 1,254,948,864 - context 669,843,456 = 585,105,408 B, 558 MiB;
# H7's one-rank DDP/FSDP runs in benchmarks/data/gpu_measurements.jsonl show 470-490 MiB more beyond reserved than
# the same runs over gloo, so the probe's figure is the high end).
ONE_RANK_COMM_BYTES = 1_254_948_864 - 669_843_456
NVLS_CHANNELS = 16  # NCCL_NVLS_NCHANNELS default
NVLS_STEP_BYTES = 128 * 1024 * 8  # nvlsChunkSize 128 KiB × NCCL_STEPS 8 (src/transport/nvls.cc)


def _local_members(rank: int, base: int, stride: int, size: int, gpus_per_node: int) -> int:
    """How many of the group base + k·stride (k < size) sit on `rank`'s node (ranks fill nodes in order)."""
    node = rank // gpus_per_node
    low, high = node * gpus_per_node, (node + 1) * gpus_per_node - 1
    k_low = max(0, math.ceil((low - base) / stride))
    k_high = min(size - 1, (high - base) // stride)
    return max(0, k_high - k_low + 1)


def _groups(layout: ParallelLayout, rank: int) -> list[tuple[str, int, int, int]]:
    """(name, base rank, stride, size) of each collective group of more than one rank that `rank` belongs to."""
    pp_i, dp_i, tp_i = layout.coords(rank)
    groups = []
    if layout.tp > 1:
        groups.append(("tp", layout.rank_of(pp_i, dp_i, 0), 1, layout.tp))
    if layout.dp > 1 and layout.replicate_x_shard:
        shard = layout.hsdp_shard
        block = dp_i // shard * shard
        if shard > 1:
            groups.append(("dp_shard", layout.rank_of(pp_i, block, tp_i), layout.tp, shard))
        if layout.dp // shard > 1:
            groups.append(("dp_replicate", layout.rank_of(pp_i, dp_i % shard, tp_i), layout.tp * shard,
                           layout.dp // shard))
    elif layout.dp > 1:
        groups.append(("dp", layout.rank_of(pp_i, 0, tp_i), layout.tp, layout.dp))
    if len([g for g in (layout.dp, layout.tp, layout.pp) if g > 1]) > 1:
        # A multi-dimensional mesh makes sub-groups; the default (world) group gets a communicator of its own as
        # soon as anything (a barrier, a checkpoint, a metric) runs on it. Counted: the high end.
        groups.append(("world", 0, 1, layout.world_size))
    return groups


def _nvls_bytes(local: int, device: Any) -> int:
    """NVLS buffers of one communicator on this GPU (Hopper or later with NVSwitch, 2+ ranks on the node)."""
    gpu = getattr(device, "gpu", None)
    name = str(getattr(device, "name", ""))
    if gpu is None or tuple(gpu.compute_capability) < (9, 0) or "pcie" in name or local < 2:
        return 0
    return NVLS_CHANNELS * 2 * NVLS_STEP_BYTES * local


def _pipeline_peers(layout: ParallelLayout) -> int:
    """Distinct send/recv peers of a pipeline rank: the previous and the next stage (one when pp is 2)."""
    return 0 if layout.pp == 1 else min(2, layout.pp - 1)


def nccl_process_bytes(layout: ParallelLayout, role: Any, device: Any) -> tuple[int, str]:
    """(bytes, assumption) NCCL holds on this rank's GPU for its communicators, outside PyTorch's allocator.
    `role` is a RankRole (its `.rank` is used) or a rank number; `device` a trainmem Device. CPU: (0, why)."""
    if getattr(device, "kind", "cpu") != "cuda":
        return 0, "no NCCL on the CPU (gloo's buffers are tensors, traced)"
    layout = layout.resolve()
    rank = int(getattr(role, "rank", role))
    per_comm = CHANNELS * COLL_CONNECTIONS * (RECV_BYTES + SEND_BYTES)
    total, parts = 0, []
    for name, base, stride, size in _groups(layout, rank):
        nvls = _nvls_bytes(_local_members(rank, base, stride, size, layout.gpus_per_node), device)
        total += per_comm + nvls
        parts.append(f"{name} ({size} ranks{', NVLS' if nvls else ''})")
    peers = _pipeline_peers(layout)
    if peers:
        total += peers * CHANNELS * P2P_BYTES_PER_CHANNEL
        parts.append(f"pp send/recv ({peers} peer{'s' if peers > 1 else ''})")
    if not parts:
        if layout.strategy == Strategy.NONE:
            return 0, "one rank: no NCCL communicator"
        return ONE_RANK_COMM_BYTES, (f"NCCL: --strategy {layout.strategy.value} on one rank still initialises NCCL "
                                     f"(init_process_group('nccl'), the wrapper's collectives on a one-rank group): "
                                     f"{ONE_RANK_COMM_BYTES // MIB} MiB for the process's only communicator, measured "
                                     "on an H200 (NCCL 2.28.9, 64 channels; benchmarks/nccl_memory_probe.py)")
    total += FIRST_COMM_BYTES
    text = (f"NCCL: {len(parts)} communicator use(s) on this rank — {', '.join(parts)}; each collective communicator "
            f"{CHANNELS} channels × ring + tree × (10 MiB LL/LL128/Simple FIFO + 2 MiB) = "
            f"{per_comm // MIB} MiB at NCCL_BUFFSIZE's default 4 MiB"
            + (", NVLS 16 channels × 2 × 1 MiB × the group's GPUs on the node" if any("NVLS" in p for p in parts)
               else "")
            + (f", send/recv {CHANNELS} channels × 14 MiB a peer" if peers else "")
            + f", plus {FIRST_COMM_BYTES // MIB} MiB once a process (NCCL's device code, measured on an H200)"
            + ". The high end of what was measured (388 MiB-688 MB a communicator on RTX 3060/A100, NVIDIA/nccl#964, "
              "sglang#35538); fewer channels, ncclCommSplit resource sharing or a smaller NCCL_BUFFSIZE use less.")
    return total, text
