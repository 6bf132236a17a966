"""The CPU allocator models on hand-built event streams, expected values from the rules in alloc/cpu.py
(c10's 64-byte posix_memalign; glibc's mmap threshold, heap growth, coalescing and trimming)."""

from trainmem.alloc.cpu import MMAP_THRESHOLD_START, PAGE, GlibcModel, aligned, replay_tensors
from trainmem.targets import DeviceEvent
from trainmem.trace.events import Category, Phase


def ev(action, nbytes, key, category=Category.TEMPORARIES):
    return DeviceEvent(action, nbytes, key, category, Phase.FORWARD, "m", "op", 0, 0)


def test_tensor_replay_rounds_each_request_to_64_bytes():
    stream = [ev("alloc", 4, 1), ev("alloc", 100, 2), ev("free", 4, 1), ev("alloc", 64, 3)]
    replay = replay_tensors(stream)
    assert aligned(4) == 64 and aligned(100) == 128
    assert replay.peak_bytes == 64 + 128  # the later 64-byte chunk comes after a 64-byte free
    assert replay.final_bytes == 192


def test_peak_live_set_is_the_one_at_the_peak():
    stream = [ev("alloc", 1000, 1, Category.PARAMETERS), ev("alloc", 5000, 2), ev("free", 5000, 2), ev("alloc", 10, 3)]
    replay = replay_tensors(stream)
    assert set(replay.live_at_peak) == {1, 2}


def test_large_request_is_mapped_and_returned():
    glibc = GlibcModel()
    glibc.malloc(1, 1 << 20)
    assert glibc.mapped >= 1 << 20 and glibc.brk == 0
    glibc.free(1)
    assert glibc.mapped == 0
    assert glibc.mmap_threshold > 1 << 20  # the freed mapping raised the threshold to its size


def test_after_threshold_rises_same_size_goes_to_heap_and_stays_resident():
    glibc = GlibcModel()
    glibc.malloc(1, 1 << 20)
    glibc.free(1)
    glibc.malloc(2, 1 << 20)
    assert glibc.mapped == 0 and glibc.brk >= 1 << 20
    glibc.malloc(3, 4096)  # a small chunk above it pins the heap top
    glibc.free(2)
    assert glibc.brk >= 1 << 20  # interior free memory stays resident


def test_top_is_trimmed_past_the_trim_threshold():
    glibc = GlibcModel()
    glibc.malloc(1, 1000)
    glibc.malloc(2, 100_000)
    high = glibc.brk
    glibc.free(2)
    assert glibc.brk == high  # 100 kB free at the top is below the 256 KiB trim threshold
    glibc.malloc(3, 120_000)
    glibc.malloc(4, 120_000)
    glibc.free(4)
    glibc.free(3)
    assert glibc.brk < glibc.top_start + 2 * MMAP_THRESHOLD_START + PAGE


def test_freed_chunks_coalesce_and_are_reused():
    glibc = GlibcModel()
    for key in range(4):
        glibc.malloc(key, 10_000)
    top = glibc.brk
    glibc.free(1)
    glibc.free(2)
    glibc.malloc(9, 19_000)  # fits in the merged hole of chunks 1 and 2
    assert glibc.brk == top
