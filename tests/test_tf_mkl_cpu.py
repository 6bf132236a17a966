"""alloc/tf_mkl_cpu.py: the MklCPUAllocator's rules from TensorFlow's sources, and its pool's resident pages
worked out by hand (no TensorFlow)."""

from __future__ import annotations

from trainmem.alloc import tf_mkl_cpu as mkl
from trainmem.alloc.device_events import DeviceEvent
from trainmem.trace.events import Category, Phase

MIB = 2**20


def _events(*steps: tuple[str, int, int]) -> list[DeviceEvent]:
    """(action, bytes, key) in order."""
    return [DeviceEvent(action, nbytes, key, Category.ACTIVATIONS, Phase.FORWARD, "m", "Op", 0, i)
            for i, (action, nbytes, key) in enumerate(steps)]


def test_small_requests_go_to_glibc_large_ones_to_the_pool():
    # AllocateRaw: num_bytes < kSmallAllocationsThreshold → MklSmallSizeAllocator (port::AlignedMalloc);
    # TensorFlow 2.21's threshold, measured with get_memory_info: 262,143 B stays out, 262,144 B goes in
    assert not mkl.pooled(262_143) and mkl.pooled(262_144)
    # TF_ONEDNN_USE_SYSTEM_ALLOCATOR (UseSystemAlloc) sends everything to the small path
    assert not mkl.pooled(64 * MIB, system_alloc=True)
    assert mkl.uses_system_alloc({"TF_ONEDNN_USE_SYSTEM_ALLOCATOR": "TRUE"})
    assert not mkl.uses_system_alloc({})
    events = _events(("alloc", 4096, 1), ("alloc", MIB, 2), ("free", 4096, 1), ("free", MIB, 2))
    assert [(e.action, e.key) for e in mkl.small_events(events)] == [("alloc", 1), ("free", 1)]


def test_environment_booleans_as_tsl_reads_them():
    # ReadBoolFromEnvVar: unset → default; "true"/"1"/"false"/"0" in any case; else an error, default kept
    assert mkl.read_bool_env(None, True) == (True, True)
    assert mkl.read_bool_env("0", True) == (False, True) and mkl.read_bool_env("True", False) == (True, True)
    assert mkl.read_bool_env("yes", False) == (False, False)


def test_pool_limit_is_physical_memory_unless_the_variable_says():
    # MklCPUAllocator::Initialize: sysconf(_SC_PHYS_PAGES) * sysconf(_SC_PAGESIZE), or TF_MKL_ALLOC_MAX_BYTES
    assert mkl.memory_limit({}, physical=16 << 30) == 16 << 30
    assert mkl.memory_limit({"TF_MKL_ALLOC_MAX_BYTES": "1000000000"}, physical=16 << 30) == 1_000_000_000
    assert mkl.memory_limit({}) > 0


def test_one_tensor_touches_its_pages_only():
    # 1 MiB: the first region is 2 MiB (allow_growth's 2 MiB start), its user memory at the mapping's
    # start + 64: the tensor covers bytes 64 .. 64 + 1 MiB, pages 0 .. 256 (the header's page 0 included)
    pool = mkl.replay_pool(_events(("alloc", MIB, 1)), limit=8 << 30)
    assert pool.region_history == (2 * MIB,)
    assert pool.resident == 257 * 4096
    assert pool.peak_in_use == MIB  # 256-B rounded; the 2 MiB chunk was split (2 MiB >= 2 × 1 MiB)


def test_freed_chunks_stay_resident_and_are_reused():
    # the pool never gives a region back (garbage_collection false): a freed tensor's pages stay; the
    # next request of the same size takes the same chunk (best fit), touching nothing new
    once = mkl.replay_pool(_events(("alloc", MIB, 1), ("free", MIB, 1)), limit=8 << 30)
    again = mkl.replay_pool(_events(("alloc", MIB, 1), ("free", MIB, 1), ("alloc", MIB, 2), ("free", MIB, 2),
                                    ("alloc", 300_000, 3)), limit=8 << 30)
    assert once.resident == again.resident == 257 * 4096
    # two live at once: the second takes the 2 MiB region's tail: pages 0 .. 512
    both = mkl.replay_pool(_events(("alloc", MIB, 1), ("alloc", MIB, 2)), limit=8 << 30)
    assert both.resident == 513 * 4096 and both.region_history == (2 * MIB,)


def test_regions_double_and_the_third_tensor_opens_a_new_one():
    # Extend: a 2 MiB region for the first MiB; an extension that needed no doubling doubles
    # curr_region_allocation_bytes for the next one: 3 MiB gets a 4 MiB region, then 2 MiB (the two 1 MiB
    # tails are apart) an 8 MiB one
    pool = mkl.replay_pool(_events(("alloc", MIB, 1), ("alloc", 3 * MIB, 2), ("alloc", 2 * MIB, 3)), limit=8 << 30)
    assert pool.region_history == (2 * MIB, 4 * MIB, 8 * MIB)
    # each region: its own page 0 and the pages its tensor covers; 3 MiB over bytes 64 .. 64 + 3 MiB: 769 pages
    assert pool.resident == (257 + 769 + 513) * 4096


def test_touched_pages_merge():
    pages = mkl.TouchedPages()
    pages.touch(0, 0, 4)
    pages.touch(0, 10, 12)
    pages.touch(0, 3, 11)
    pages.touch(1, 0, 1)
    assert pages.pages == 13 and pages.bytes == 13 * 4096
