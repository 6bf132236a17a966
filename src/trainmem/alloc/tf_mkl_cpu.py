"""TensorFlow's MklCPUAllocator, the CPU allocator of oneDNN builds when oneDNN is on, replayed in pure
Python: which requests it pools, and which of the pool's pages are resident.

From TensorFlow's sources (tensorflow/core/common_runtime/mkl_cpu_allocator.h, threadpool_device.cc,
tensorflow/core/util/util.cc and onednn_env_vars.cc):
- registration: threadpool_device.cc registers MklCPUAllocatorFactory with REGISTER_MEM_ALLOCATOR at
  priority 200 when IsMKLEnabled(), else 50, below the default CPUAllocator's 100: every tensor of the
  CPU device and cpu_allocator() then go through it. IsMKLEnabled (util.cc) reads TF_ENABLE_ONEDNN_OPTS
  once (tsl ReadBoolFromEnvVar) and falls back to DefaultOneDnnPolicy, which on Linux x86 turns oneDNN on
  for CPUs with AVX512_VNNI, AVX512_BF16, AVX_VNNI or AMX: `onednn_choice` below;
- AllocateRaw: a request below kSmallAllocationsThreshold goes to MklSmallSizeAllocator, which calls
  port::AlignedMalloc (glibc's posix_memalign) and frees with port::AlignedFree; a request at or above it
  goes to a BFCAllocator (`large_size_allocator_`), which keeps the address in large_allocations_map_ so
  that DeallocateRaw sends the free back to it. With TF_ONEDNN_USE_SYSTEM_ALLOCATOR true (UseSystemAlloc,
  default false) every request takes the small path. The threshold is 4096 B in the sources of 2018-2022;
  TensorFlow 2.21 pools from 256 KiB: measured here with get_memory_info('CPU:0') (the BFC's statistics
  only, as MklCPUAllocator::GetStats adds the small allocator's, which keeps none unless
  mkl_small_allocator_collect_stats): a 262,143-byte tensor leaves "current" at 0, a 262,144-byte one
  makes it 262,144;
- the BFCAllocator is built with Options.allow_growth = kAllowGrowth (true) and default options
  otherwise (garbage_collection false: no region is ever given back), total_memory = physical RAM
  (sysconf(_SC_PHYS_PAGES) * sysconf(_SC_PAGESIZE)) unless TF_MKL_ALLOC_MAX_BYTES says otherwise; its
  SubAllocator is MklSubAllocator, a BasicCPUAllocator without NUMA affinity: each region is one
  port::AlignedMalloc(bytes, 64). The BFC rules (256-B rounding, best fit, splitting, coalescing, regions
  of 2 MiB doubling) are alloc/tf_bfc.py's.

Resident pages. A region is a fresh glibc mapping (posix_memalign of 2 MiB and up: above glibc's mmap
threshold of 128 KiB at start; a region allocated from the heap top, when the dynamic threshold has risen,
is untouched memory too): its pages count in RSS once written, and since the pool never frees a region,
a page once written stays resident. So the pool's resident bytes are the pages ever covered by a tensor
(each written in full by its kernel), plus the page holding glibc's chunk header. posix_memalign(64) of a
mapped chunk returns the mapping's start + 64 (malloc.c _int_memalign moves the chunk header from +0 to
+48), so a region's byte b lies in page (b + 64) // 4096. Transparent huge pages are not modelled (this
machine's THP setting is madvise: anonymous mappings get 4 KiB pages).
"""

from __future__ import annotations

import bisect
import dataclasses
import os
import platform
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

from trainmem.alloc.tf_bfc import BfcAllocator, BfcConfig, BfcOutOfMemory
from trainmem.alloc.device_events import DeviceEvent

SMALL_ALLOCATIONS_THRESHOLD = 262_144  # TensorFlow 2.21, measured (see above); 4096 in older sources
PAGE = 4096
REGION_USER_OFFSET = 64  # posix_memalign(64) on a mapped chunk: the mapping's start + 64
MAX_LIMIT_ENV = "TF_MKL_ALLOC_MAX_BYTES"  # MklCPUAllocator::kMaxLimitStr
SYSTEM_ALLOC_ENV = "TF_ONEDNN_USE_SYSTEM_ALLOCATOR"  # onednn_env_vars.cc UseSystemAlloc
ONEDNN_FLAGS = ("avx512_vnni", "avx512_bf16", "avx_vnni", "amx_tile", "amx_int8", "amx_bf16")  # util.cc
ONEDNN_ENV = "TF_ENABLE_ONEDNN_OPTS"
ONEDNN_MODES = ("auto", "on", "off")
NEOVERSE_V1 = ("0x41", "0xd40")  # util.cc TestAarch64CPU(ARM_NEOVERSE_V1): implementer, part


def read_bool_env(value: str | None, default: bool) -> tuple[bool, bool]:
    """tsl ReadBoolFromEnvVar: (value, understood). Unset → the default; "true"/"1" and "false"/"0" in any
    case; anything else is refused with an error status and the caller keeps its default."""
    if value is None:
        return default, True
    text = value.lower()
    if text in ("true", "1"):
        return True, True
    if text in ("false", "0"):
        return False, True
    return default, False


@dataclasses.dataclass(frozen=True)
class OneDnnChoice:
    on: bool
    reason: str  # in words: what decided it


def cpu_flags() -> tuple[frozenset[str], dict[str, str]]:
    """This machine's /proc/cpuinfo: the first processor's flags (x86) and its other fields."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return frozenset(), {}
    fields: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            break
        name, _, value = line.partition(":")
        fields.setdefault(name.strip(), value.strip())
    return frozenset(fields.get("flags", "").split()), fields


def onednn_default(flags: frozenset[str] | None = None, fields: Mapping[str, str] | None = None,
                   system: str | None = None) -> bool:
    """util.cc DefaultOneDnnPolicy for the wheels of pypi: Linux x86 with one of ONEDNN_FLAGS, Linux aarch64
    on Neoverse V1, Windows x86 always; macOS wheels are built without INTEL_MKL (never)."""
    system = system or sys.platform
    if flags is None and fields is None:
        flags, fields = cpu_flags()
    flags, fields = flags or frozenset(), fields or {}
    if system.startswith("win"):
        return platform.machine().lower() in ("amd64", "x86_64")
    if not system.startswith("linux"):
        return False
    if any(flag in flags for flag in ONEDNN_FLAGS):
        return True
    return (fields.get("CPU implementer", "").lower(), fields.get("CPU part", "").lower()) == NEOVERSE_V1


def onednn_choice(mode: str = "auto", environ: Mapping[str, str] | None = None,
                  flags: frozenset[str] | None = None) -> OneDnnChoice:
    """Whether the modelled process runs with oneDNN, as util.cc IsMklEnabled decides at its first call:
    TF_ENABLE_ONEDNN_OPTS when it reads as a boolean (tsl ReadBoolFromEnvVar), else DefaultOneDnnPolicy.
    `mode` "on"/"off" (--tf-onednn) stands for a run with TF_ENABLE_ONEDNN_OPTS=1/0."""
    if mode not in ONEDNN_MODES:
        from trainmem.errors import SetupError

        raise SetupError(f"expected {'|'.join(ONEDNN_MODES)}, got {mode!r}", where="--tf-onednn")
    if mode != "auto":
        return OneDnnChoice(mode == "on", f"--tf-onednn {mode}: a run with {ONEDNN_ENV}={int(mode == 'on')}")
    environ = os.environ if environ is None else environ
    default = onednn_default(flags) if flags is not None else onednn_default()
    policy = (f"TensorFlow's default for this CPU ({'one of ' + ', '.join(ONEDNN_FLAGS) if default else 'none of '}"
              f"{'' if default else ', '.join(ONEDNN_FLAGS)}: util.cc DefaultOneDnnPolicy)")
    value = environ.get(ONEDNN_ENV)
    chosen, understood = read_bool_env(value, default)
    if value is None:
        return OneDnnChoice(default, policy)
    if not understood:
        return OneDnnChoice(default, f"{ONEDNN_ENV}={value!r} is not a boolean, so TensorFlow keeps {policy}")
    return OneDnnChoice(chosen, f"{ONEDNN_ENV}={value} in this environment")


def physical_memory() -> int:
    """sysconf(_SC_PHYS_PAGES) * sysconf(_SC_PAGESIZE), as MklCPUAllocator::Initialize reads it."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGESIZE")
    except (ValueError, OSError, AttributeError):
        return 64 << 30  # kDefaultMaxLimit, where sysconf cannot tell


def memory_limit(environ: Mapping[str, str] | None = None, physical: int | None = None) -> int:
    """The BFC pool's total_memory: TF_MKL_ALLOC_MAX_BYTES when it parses as an unsigned integer (an
    invalid value makes TensorFlow fail its TF_CHECK_OK at start), else physical RAM."""
    environ = os.environ if environ is None else environ
    text = environ.get(MAX_LIMIT_ENV)
    if text is not None and text.strip().isdigit():
        return int(text)
    return physical if physical is not None else physical_memory()


def uses_system_alloc(environ: Mapping[str, str] | None = None) -> bool:
    environ = os.environ if environ is None else environ
    return read_bool_env(environ.get(SYSTEM_ALLOC_ENV), False)[0]


def pooled(nbytes: int, system_alloc: bool = False) -> bool:
    """Whether MklCPUAllocator::AllocateRaw sends a request of `nbytes` to its BFC pool."""
    return not system_alloc and nbytes >= SMALL_ALLOCATIONS_THRESHOLD


class TouchedPages:
    """Per region, the pages ever written, as sorted disjoint [first, end) page ranges."""

    def __init__(self) -> None:
        self._ranges: dict[int, list[tuple[int, int]]] = {}
        self.pages = 0

    def touch(self, region: int, first: int, end: int) -> None:
        ranges = self._ranges.setdefault(region, [])
        at = bisect.bisect_left(ranges, (first, first))
        if at > 0 and ranges[at - 1][1] >= first:  # merge with the range before
            at -= 1
            first = ranges[at][0]
        last = at
        while last < len(ranges) and ranges[last][0] <= end:
            end = max(end, ranges[last][1])
            last += 1
        self.pages -= sum(e - f for f, e in ranges[at:last])
        ranges[at:last] = [(first, end)]
        self.pages += end - first

    @property
    def bytes(self) -> int:
        return self.pages * PAGE


@dataclasses.dataclass(frozen=True)
class MklPoolReplay:
    """The BFC pool after a stream: what get_memory_info('CPU:0') shows and what RSS holds."""

    peak_in_use: int  # BFC chunk bytes in use at their peak (get_memory_info "peak")
    resident: int  # pages of the regions ever written (never given back)
    region_bytes: int  # what the regions hold (reserved, mostly untouched)
    region_history: tuple[int, ...]
    pooled_requests: int  # requests that went to the pool
    out_of_memory: str | None = None


def replay_pool(events: Iterable[DeviceEvent], limit: int, system_alloc: bool = False) -> MklPoolReplay:
    """Replay the pooled part of an allocator stream (requests >= the threshold; the rest are glibc's) through
    the MklCPUAllocator's BFC allocator, marking the pages each tensor covers."""
    allocator = BfcAllocator(BfcConfig(memory_limit=limit, allow_growth=True, garbage_collection=False))
    touched = TouchedPages()
    handles: dict[int, int] = {}
    count, failure, seen = 0, None, 0
    for event in events:
        if event.action != "alloc":
            if event.key in handles:
                allocator.free(handles.pop(event.key))
            continue
        if not pooled(event.nbytes, system_alloc):
            continue
        try:
            pointer = allocator.allocate(event.nbytes)
        except BfcOutOfMemory as error:
            failure = f"MklCPUAllocator pool: {error}"
            break
        handles[event.key] = pointer
        count += 1
        if len(allocator.region_history) > seen:  # a new region: glibc wrote its chunk header in page 0
            for base in sorted(allocator.regions)[seen:]:
                touched.touch(base, 0, 1)
            seen = len(allocator.region_history)
        _touch_chunk(allocator, touched, pointer, event.nbytes)
    s = allocator.stats
    return MklPoolReplay(s.peak_bytes_in_use, touched.bytes, s.pool_bytes, tuple(allocator.region_history), count,
                         failure)


def _touch_chunk(allocator: BfcAllocator, touched: TouchedPages, pointer: int, nbytes: int) -> None:
    bases = sorted(allocator.regions)
    base = bases[bisect.bisect_right(bases, pointer) - 1]
    start = pointer - base + REGION_USER_OFFSET
    touched.touch(base, start // PAGE, (start + nbytes - 1) // PAGE + 1)


def small_events(events: Iterable[DeviceEvent], system_alloc: bool = False) -> list[DeviceEvent]:
    """The stream's requests below the threshold (glibc's, through MklSmallSizeAllocator) and their frees."""
    kept: set[int] = set()
    out = []
    for event in events:
        if event.action == "alloc":
            if pooled(event.nbytes, system_alloc):
                continue
            kept.add(event.key)
            out.append(event)
        elif event.key in kept:
            kept.discard(event.key)
            out.append(event)
    return out
