"""TensorFlow's BFC allocator model on hand-built sequences. Each expected number is derived in the test's
comment from the rules of xla/tsl/framework/bfc_allocator.cc quoted in alloc/tf_bfc.py: RoundedBytes (256 B),
BinNumForSize, FindChunkPtr's best fit and split rule, TryToCoalesce, Extend, DeallocateFreeRegions."""

import pytest

from trainmem.alloc.tf_bfc import (BfcAllocator, BfcConfig, BfcOutOfMemory, bin_num_for_size,
                                   bin_size, replay_bfc, rounded_bytes)
from trainmem.alloc.device_events import DeviceEvent
from trainmem.alloc.tf_bfc_allocator import TfBfcAllocator
from trainmem.trace.events import Category, Phase

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30


def test_requests_round_up_to_256_bytes():
    # RoundedBytes: 256 * ceil(bytes / 256).
    assert [rounded_bytes(n) for n in (1, 255, 256, 257, 511, 512, 1000)] == [256, 256, 256, 512, 512, 512, 1024]
    a = BfcAllocator(BfcConfig(64 * MiB, allow_growth=True))
    h = a.allocate(1)
    # a 1-byte tensor holds a 256-B chunk: the 2 MiB first region (>= 2 * 256) is split at 256 B.
    assert a.chunk_size(h) == 256 and a.stats.bytes_in_use == 256
    assert a.chunks() == [[(256, True), (2 * MiB - 256, False)]]
    with pytest.raises(ValueError):
        a.allocate(0)  # AllocateRawInternal returns nullptr for 0 B; TensorFlow never asks for it


def test_bin_numbers():
    # BinNumForSize: min(20, floor(log2(max(size, 256) >> 8))): 256..511 -> 0, 512..1023 -> 1,
    # 1 MiB = 2**20 -> 2**12 -> 12, 256 MiB = 2**28 -> 2**20 -> 20, and everything larger stays in 20.
    sizes = (0, 256, 511, 512, 1023, 1024, MiB, MiB - 1, 256 * MiB - 1, 256 * MiB, GiB, 64 * GiB)
    assert [bin_num_for_size(n) for n in sizes] == [0, 0, 0, 1, 1, 2, 12, 11, 19, 20, 20, 20]
    # the ctor's CHECKs: bin b covers [256 << b, 256 << (b + 1))
    for b in range(20):
        assert bin_num_for_size(bin_size(b)) == b == bin_num_for_size(2 * bin_size(b) - 1)


def test_a_chunk_less_than_twice_the_request_is_not_split():
    # limit 1 MiB, no growth: the first request maps one region of RoundedBytes(1 MiB) = 1 MiB.
    # 600 KiB = 614,400 B (already a multiple of 256). 1,048,576 < 2 * 614,400 = 1,228,800 and the
    # remainder 434,176 < 128 MiB: the chunk is handed out whole, so bytes_in_use is 1 MiB.
    a = BfcAllocator(BfcConfig(MiB))
    h = a.allocate(600 * KiB)
    assert a.chunk_size(h) == MiB and a.stats.bytes_in_use == MiB
    assert a.chunks() == [[(MiB, True)]]
    # nothing is left: the pool is at the limit (Extend refuses), no region is idle (no GC) -> OOM
    with pytest.raises(BfcOutOfMemory, match="rounded to 256"):
        a.allocate(1)
    # 500 KiB = 512,000 B instead: 1,048,576 >= 1,024,000 -> split, 536,576 B stay free.
    b = BfcAllocator(BfcConfig(MiB))
    b.allocate(500 * KiB)
    assert b.chunks() == [[(512_000, True), (536_576, False)]]


def test_the_128_mib_rule_splits_large_chunks():
    # limit 1 GiB, no growth: one 1024 MiB region. 600 MiB: 1024 < 1200 but the remainder 424 MiB
    # >= 128 MiB (kMaxInternalFragmentation default) -> split.
    a = BfcAllocator(BfcConfig(GiB))
    a.allocate(600 * MiB)
    assert a.chunks() == [[(600 * MiB, True), (424 * MiB, False)]]
    # 300 MiB from the 424 MiB chunk: 424 < 600 and 124 MiB < 128 MiB -> whole chunk, in use 1024 MiB.
    a.allocate(300 * MiB)
    assert a.stats.bytes_in_use == GiB and a.chunks() == [[(600 * MiB, True), (424 * MiB, True)]]
    # fragmentation_fraction 0.1 of 1 GiB = 107,374,182 B (the double truncated to int64): 124 MiB =
    # 130,023,424 B >= that -> the 424 MiB chunk is split, in use 900 MiB.
    b = BfcAllocator(BfcConfig(GiB, fragmentation_fraction=0.1))
    b.allocate(600 * MiB)
    b.allocate(300 * MiB)
    assert b.stats.bytes_in_use == 900 * MiB
    assert b.chunks() == [[(600 * MiB, True), (300 * MiB, True), (124 * MiB, False)]]


def test_best_fit_takes_the_smallest_free_chunk_that_fits():
    # limit 4 MiB, no growth: chunks [1 MiB a][1 MiB b][1 MiB c][1 MiB free] (each split: the free
    # chunk is >= 2x). Free a and c: c merges with the free tail -> [1 free][b][2 MiB free].
    a = BfcAllocator(BfcConfig(4 * MiB))
    ha, hb, hc = (a.allocate(MiB) for _ in range(3))
    a.free(ha)
    a.free(hc)
    assert a.chunks() == [[(MiB, False), (MiB, True), (2 * MiB, False)]]
    # 512 KiB: bin 11 (512 KiB) holds nothing that fits below the 1 MiB chunk in bin 12, which is the
    # smallest fit; 1 MiB >= 2 * 512 KiB -> split there, the 2 MiB chunk is untouched.
    a.allocate(512 * KiB)
    assert a.chunks() == [[(512 * KiB, True), (512 * KiB, False), (MiB, True), (2 * MiB, False)]]


def test_free_coalesces_with_both_neighbours_and_fragmentation_fails_a_request():
    # limit 1 MiB, no growth. a, b, c of 256 KiB each split the region (1 MiB >= 512 KiB, 768 KiB >=
    # 512 KiB, 512 KiB >= 512 KiB): [a][b][c][256 KiB free].
    alloc = BfcAllocator(BfcConfig(MiB))
    ha, hb, hc = (alloc.allocate(256 * KiB) for _ in range(3))
    alloc.free(ha)  # no free neighbour on the left, b in use on the right: stays 256 KiB
    alloc.free(hc)  # merges with the free tail: 512 KiB
    assert alloc.chunks() == [[(256 * KiB, False), (256 * KiB, True), (512 * KiB, False)]]
    assert alloc.stats.bytes_in_use == 256 * KiB and alloc.largest_free_chunk() == 512 * KiB
    # 768 KiB fails although 768 KiB of the 1 MiB limit are free: no chunk is large enough, the pool
    # is at the limit and the one region has a chunk in use (DeallocateFreeRegions finds nothing).
    with pytest.raises(BfcOutOfMemory, match="262,144 B in use"):
        alloc.allocate(768 * KiB)
    # freeing b merges it with the next (512 KiB) then the previous (256 KiB) chunk: one 1 MiB chunk.
    alloc.free(hb)
    assert alloc.chunks() == [[(MiB, False)]]
    h = alloc.allocate(768 * KiB)  # 1 MiB < 1.5 MiB, remainder 256 KiB < 128 MiB: not split
    assert alloc.chunk_size(h) == MiB


def test_allow_growth_regions_double():
    # limit 64 MiB with allow_growth: curr_region_allocation_bytes_ starts at RoundedBytes(min(64 MiB,
    # 2 MiB)) = 2 MiB.
    a = BfcAllocator(BfcConfig(64 * MiB, allow_growth=True))
    a.allocate(MiB)  # no chunk: Extend 2 MiB (1 MiB fits, not increased -> next is 4 MiB); split 1+1
    a.allocate(3 * MiB // 2)  # free 1 MiB too small: Extend 4 MiB (next 8 MiB); split 1.5 + 2.5
    a.allocate(3 * MiB)  # free 1 and 2.5 MiB too small: Extend 8 MiB (next 16 MiB); split 3 + 5
    assert a.region_history == [2 * MiB, 4 * MiB, 8 * MiB] and a.stats.pool_bytes == 14 * MiB
    # 20 MiB > 16 MiB: doubled to 32 MiB (increased, so no further doubling); min(32, 64 - 14) = 32 MiB
    h20 = a.allocate(20 * MiB)
    assert a.region_history[-1] == 32 * MiB and a.stats.pool_bytes == 46 * MiB
    assert a.curr_region_allocation_bytes == 32 * MiB
    # the 32 MiB chunk serves 20 MiB whole: 32 < 2 * 20 and the 12 MiB remainder < 128 MiB (no split)
    assert a.chunk_size(h20) == 32 * MiB
    assert a.stats.bytes_in_use == MiB + 3 * MiB // 2 + 3 * MiB + 32 * MiB  # 37.5 MiB
    # 30 MiB: free chunks 1, 2.5, 5 MiB; Extend: 30 > 64 - 46 = 18 MiB left -> refused; every region
    # holds a chunk in use -> OOM with 37.5 MiB in use and 46 MiB mapped, below the 64 MiB limit.
    with pytest.raises(BfcOutOfMemory):
        a.allocate(30 * MiB)
    assert a.stats.bytes_in_use == 37 * MiB + MiB // 2 and a.stats.peak_pool_bytes == 46 * MiB
    # free the 20 MiB chunk: its 32 MiB region is idle. 40 MiB: no fit, 40 > 18 left; GC releases the
    # idle region (64 - 46 + 32 = 50 >= 40), pool 14 MiB; Extend: 40 > 32 -> 64, min(64, 50) = 50 MiB.
    a.free(h20)
    h40 = a.allocate(40 * MiB)
    assert a.garbage_collections == 1
    assert a.region_history == [2 * MiB, 4 * MiB, 8 * MiB, 32 * MiB, 50 * MiB]
    assert a.stats.pool_bytes == 64 * MiB and a.stats.peak_pool_bytes == 64 * MiB
    # 50 < 80 and 10 MiB < 128 MiB: the whole region is the chunk
    assert a.chunk_size(h40) == 50 * MiB and a.stats.bytes_in_use == 55 * MiB + MiB // 2


def test_without_garbage_collection_an_idle_region_is_kept_and_the_request_fails():
    # the same sequence with TF_ENABLE_GPU_GARBAGE_COLLECTION=false: the idle 32 MiB region stays
    a = BfcAllocator(BfcConfig(64 * MiB, allow_growth=True, garbage_collection=False))
    for n in (MiB, 3 * MiB // 2, 3 * MiB):
        a.allocate(n)
    a.free(a.allocate(20 * MiB))
    with pytest.raises(BfcOutOfMemory):
        a.allocate(40 * MiB)
    assert a.stats.pool_bytes == 46 * MiB and a.garbage_collections == 0


def test_without_growth_the_first_request_maps_the_whole_limit():
    # curr_region_allocation_bytes_ = RoundedBytes(10 MiB + 100) = 10 MiB + 256, but Extend caps the
    # region at the limit rounded down to 256 B: 10 MiB.
    a = BfcAllocator(BfcConfig(10 * MiB + 100))
    a.allocate(1)
    assert a.region_history == [10 * MiB] and a.stats.pool_bytes == 10 * MiB
    # a request above what is left of the limit fails at once (Extend: rounded_bytes > available)
    with pytest.raises(BfcOutOfMemory, match="10,485,761 B"):
        BfcAllocator(BfcConfig(10 * MiB)).allocate(10 * MiB + 1)


def test_sub_allocator_failure_backpedals_by_ten_percent():
    # limit 10 MiB but cuMemAlloc can give 9.5 MiB: 10 MiB fails, RoundedBytes(10 MiB * 0.9) = 9 MiB
    # (9,437,184, a multiple of 256) succeeds.
    a = BfcAllocator(BfcConfig(10 * MiB, device_free=9 * MiB + MiB // 2))
    a.allocate(MiB)
    assert a.region_history == [9 * MiB]


def _event(action, key, nbytes, category=Category.ACTIVATIONS, op="MatMul"):
    return DeviceEvent(action, nbytes, key, category, Phase.FORWARD, "dense", op, 0, key)


def test_replay_reports_peak_regions_and_live_set_by_category():
    # growth, limit 64 MiB. w = 1000 B (chunk 1024 in the 2 MiB region, split), x = 1 MiB: the
    # 2,096,128-B remainder is < 2 MiB and 1,047,552 B < 128 MiB -> not split, 2,096,128 B charged.
    # peak after x: 1024 + 2,096,128 = 2 MiB. y = 3 MiB after freeing x: the 2,096,128-B chunk is too
    # small; Extend 4 MiB, not split (4 < 6): in use 1024 + 4 MiB, the new peak.
    events = [_event("alloc", 1, 1000, Category.PARAMETERS), _event("alloc", 2, MiB),
              _event("free", 2, MiB), _event("alloc", 3, 3 * MiB, Category.GRADIENTS, op="MatMulGrad"),
              _event("alloc", 4, 0), _event("free", 99, 5)]
    r = replay_bfc(events, BfcConfig(64 * MiB, allow_growth=True))
    assert r.peak_in_use == 1024 + 4 * MiB and r.peak_index == 3
    assert r.region_history == (2 * MiB, 4 * MiB) and r.peak_region_bytes == 6 * MiB
    assert r.live_at_peak == {Category.PARAMETERS: 1024, Category.GRADIENTS: 4 * MiB}
    assert r.requested_at_peak == {Category.PARAMETERS: 1000, Category.GRADIENTS: 3 * MiB}
    assert r.tensor_peak == 1000 + 3 * MiB and r.zero_byte_requests == 1 and r.out_of_memory is None
    # the protocol view: allocated = peak in use, reserved = the regions' peak, charged = the request as asked
    # (the breakdown's one charging rule: count × item size in its category, the 256-B rounding under runtime)
    result = TfBfcAllocator(BfcConfig(64 * MiB, allow_growth=True)).replay(events)
    assert (result.allocated, result.reserved, sorted(result.live)) == (1024 + 4 * MiB, 6 * MiB, [1, 3])
    assert TfBfcAllocator(BfcConfig(MiB)).charged(1000) == 1000


def test_replay_out_of_memory_names_the_request():
    # limit 2 MiB without growth: 1.5 MiB takes the whole 2 MiB region (2 < 3, 0.5 MiB < 128 MiB);
    # the next 1 KiB finds nothing -> the replay stops there.
    events = [_event("alloc", 1, 3 * MiB // 2), _event("alloc", 2, 1024, op="Conv2D"), _event("free", 1, 0)]
    r = replay_bfc(events, BfcConfig(2 * MiB))
    assert r.out_of_memory is not None and "1,024 B for op Conv2D in dense" in r.out_of_memory
    assert r.peak_in_use == 2 * MiB and r.peak_index == 0
