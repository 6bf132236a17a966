"""The CUDA caching allocator model on hand-built sequences. Each expected number is derived in the
test's comment from the rules of c10/cuda/CUDACachingAllocator.cpp quoted in alloc/cuda_caching.py."""

from types import SimpleNamespace

import pytest

from trainmem.alloc.cuda_caching import (
    MiB,
    AllocatorConfig,
    CudaCachingAllocator,
    CudaOutOfMemoryError,
    get_allocation_size,
    replay,
    round_size,
    roundup_power2_next_division,
)

GiB = 1024 * MiB


def blocks(alloc):
    """(size, allocated) of every block, segment by segment, in address order."""
    return [[(b.size, b.state == "active_allocated") for b in seg.blocks] for seg in alloc.snapshot()]


def test_requests_round_to_512_bytes():
    # round_size: below kMinBlockSize (512) -> 512, else up to a multiple of 512.
    assert [round_size(n) for n in (0, 1, 511, 512, 513, 1024, 1025)] == [512, 512, 512, 512, 1024, 1024, 1536]
    alloc = CudaCachingAllocator()
    alloc.malloc("a", 1)
    # allocated counts the rounded block (512), requested the asked-for byte.
    assert alloc.allocated_bytes == 512
    assert alloc.memory_stats()["requested_bytes.all.current"] == 1
    alloc.malloc("empty", 0)  # allocate(0) never reaches DeviceCachingAllocator::malloc
    alloc.free("empty")
    assert alloc.memory_stats()["allocation.all.allocated"] == 1


def test_small_pool_packs_requests_into_2mib_segments():
    # <= 1 MiB after rounding: small pool; a new small segment is kSmallBuffer = 2 MiB.
    alloc = CudaCachingAllocator()
    alloc.malloc("a", 100)  # 512 B block, 2 MiB - 512 left free in the same segment
    alloc.malloc("b", MiB)  # exactly 1 MiB is still small; it fits in the remainder
    assert alloc.reserved_bytes == 2 * MiB and alloc.num_segments == 1
    assert alloc.memory_stats()["reserved_bytes.small_pool.current"] == 2 * MiB
    alloc.malloc("c", MiB)  # only 1 MiB - 512 left: a second 2 MiB segment
    assert alloc.reserved_bytes == 4 * MiB and alloc.num_segments == 2


def test_large_pool_segment_sizes():
    # get_allocation_size: (1 MiB, 10 MiB) -> kLargeBuffer 20 MiB; >= 10 MiB -> rounded up to 2 MiB.
    assert get_allocation_size(round_size(MiB + 1)) == 20 * MiB  # MiB + 512 is already large
    assert get_allocation_size(10 * MiB - 512) == 20 * MiB
    assert get_allocation_size(10 * MiB) == 10 * MiB
    assert get_allocation_size(10 * MiB + 512) == 12 * MiB
    alloc = CudaCachingAllocator()
    alloc.malloc("a", MiB + 1)  # 20 MiB segment, split: 20 MiB - (1 MiB + 512) > 1 MiB stays free
    assert (alloc.reserved_bytes, alloc.allocated_bytes) == (20 * MiB, MiB + 512)
    assert alloc.memory_stats()["reserved_bytes.large_pool.current"] == 20 * MiB
    alloc.malloc("b", 10 * MiB)  # 19 MiB - 512 free is enough: same segment
    assert alloc.reserved_bytes == 20 * MiB
    alloc.malloc("c", 10 * MiB)  # 9 MiB - 512 left: a new exact 10 MiB segment
    assert alloc.reserved_bytes == 30 * MiB and alloc.num_segments == 2


def test_small_pool_split_needs_a_512_byte_remainder():
    alloc = CudaCachingAllocator()
    alloc.malloc("a", MiB - 512)  # 2 MiB segment: [1 MiB - 512 used][1 MiB + 512 free]
    alloc.malloc("b", MiB)  # remainder exactly 512 >= kMinBlockSize: split, 512 B stays free
    assert blocks(alloc) == [[(MiB - 512, True), (MiB, True), (512, False)]]
    assert alloc.allocated_bytes == 2 * MiB - 512
    # Small-pool sizes are multiples of 512, so a 511-byte remainder only arises for a block built
    # by hand: should_split refuses it and the whole block would be handed out.
    block = SimpleNamespace(size=MiB + 511, small=True)
    assert alloc._should_split(block, MiB) is False
    assert alloc._should_split(SimpleNamespace(size=MiB + 512, small=True), MiB) is True


def test_large_pool_split_needs_more_than_1mib_remainder():
    # 19 MiB -> a 20 MiB segment (rounded to 2 MiB); remainder exactly 1 MiB is not > kSmallSize:
    # no split, the whole 20 MiB counts as allocated.
    alloc = CudaCachingAllocator()
    alloc.malloc("a", 19 * MiB)
    assert (alloc.allocated_bytes, alloc.reserved_bytes) == (20 * MiB, 20 * MiB)
    assert blocks(alloc) == [[(20 * MiB, True)]]
    # 19 MiB - 512 -> also a 20 MiB segment; remainder 1 MiB + 512 > 1 MiB: split.
    alloc = CudaCachingAllocator()
    alloc.malloc("a", 19 * MiB - 512)
    assert alloc.allocated_bytes == 19 * MiB - 512
    assert blocks(alloc) == [[(19 * MiB - 512, True), (MiB + 512, False)]]


def test_an_11mib_request_in_a_cached_12mib_block_counts_12mib():
    # 12 MiB -> a 12 MiB segment; freed, it is cached. 11 MiB takes it (best fit) and the 1 MiB
    # remainder is not > 1 MiB, so allocated is 12 MiB while requested is 11 MiB.
    alloc = CudaCachingAllocator()
    alloc.malloc("a", 12 * MiB)
    alloc.free("a")
    alloc.malloc("b", 11 * MiB)
    stats = alloc.memory_stats()
    assert (alloc.allocated_bytes, alloc.reserved_bytes) == (12 * MiB, 12 * MiB)
    assert stats["requested_bytes.all.current"] == 11 * MiB
    assert stats["num_device_alloc"] == 1


def test_freed_blocks_merge_and_the_merged_block_is_reused():
    alloc = CudaCachingAllocator()
    for key in "abc":
        alloc.malloc(key, 5 * MiB)  # one 20 MiB segment: [a 5][b 5][c 5][free 5]
    alloc.free("a")
    alloc.free("c")  # c merges with the free tail: [free 5][b 5][free 10]
    assert blocks(alloc) == [[(5 * MiB, False), (5 * MiB, True), (10 * MiB, False)]]
    assert alloc.memory_stats()["inactive_split_bytes.all.current"] == 15 * MiB
    alloc.free("b")  # b merges with both neighbours: one unsplit 20 MiB free block
    assert blocks(alloc) == [[(20 * MiB, False)]]
    assert alloc.memory_stats()["inactive_split.all.current"] == 0
    alloc.malloc("d", 15 * MiB)  # served by the merged block: no new segment
    assert (alloc.reserved_bytes, alloc.num_segments) == (20 * MiB, 1)
    assert blocks(alloc) == [[(15 * MiB, True), (5 * MiB, False)]]


def test_cached_blocks_serve_only_their_own_stream():
    alloc = CudaCachingAllocator()
    alloc.malloc("a", 5 * MiB, stream=0)
    alloc.free("a")  # stream 0 caches a free 20 MiB segment
    alloc.malloc("b", 5 * MiB, stream=1)  # stream 1 cannot use it: a second 20 MiB segment
    assert (alloc.reserved_bytes, alloc.num_segments) == (40 * MiB, 2)
    alloc.malloc("c", 5 * MiB, stream=0)  # stream 0 reuses its own cached segment
    assert alloc.reserved_bytes == 40 * MiB
    assert {seg.stream for seg in alloc.snapshot()} == {0, 1}


def test_max_split_size_keeps_oversize_blocks_whole():
    # max_split_size_mb:64. A cached 100 MiB block is oversize.
    config = AllocatorConfig.from_env_string("max_split_size_mb:64")
    alloc = CudaCachingAllocator(config)
    alloc.malloc("big", 100 * MiB)
    alloc.free("big")
    # A 5 MiB request is below max_split_size: the oversize block is refused, 20 MiB segment made.
    alloc.malloc("a", 5 * MiB)
    assert alloc.reserved_bytes == 120 * MiB
    # 70 MiB >= max_split_size may take an oversize block only if it is < 70 + 20 MiB
    # (max_non_split_rounding_size): 100 MiB is not, so a 70 MiB segment is made.
    alloc.malloc("b", 70 * MiB)
    assert alloc.reserved_bytes == 190 * MiB
    # 81 MiB: 100 < 81 + 20, so the cached block is taken whole (no split for >= max_split_size).
    alloc.malloc("c", 81 * MiB)
    assert alloc.reserved_bytes == 190 * MiB
    assert alloc.allocated_bytes == 5 * MiB + 70 * MiB + 100 * MiB
    assert alloc.memory_stats()["oversize_allocations.current"] == 2  # the 70 and the 100 MiB blocks


def test_roundup_power2_divisions_single_value():
    config = AllocatorConfig.from_env_string("roundup_power2_divisions:4")
    # The source's own example of the helper: 1200 between 1024 and 2048 in quarters -> 1280.
    assert roundup_power2_next_division(1200, 4) == 1280
    # round_size uses it only when size > 512 * divisions (2048): 1200 still rounds to 1536.
    assert round_size(1200, config) == 1536
    assert round_size(3000, config) == 3072  # [2048, 4096) in steps of 512
    assert round_size(5 * MiB + 1, config) == 6 * MiB  # [4, 8) MiB in steps of 1 MiB
    assert round_size(4 * MiB, config) == 4 * MiB  # powers of two are kept
    assert round_size(5 * MiB + 1) == 5 * MiB + 512  # default: plain 512 rounding
    assert round_size(MiB + 1, config) == MiB + 256 * 1024  # [1, 2) MiB in quarters: large pool


def test_roundup_power2_divisions_per_interval():
    # Upstream's AllocatorConfig_test: 'N:d' sets the interval [N MiB, 2N MiB); the first entry fills
    # everything below; '>' fills after the last named interval; unnamed gaps stay 0.
    config = AllocatorConfig.from_env_string("roundup_power2_divisions:[64:8,128:2,256:4,512:2,1024:4,>:1]")
    expected = {32: 8, 64: 8, 128: 2, 256: 4, 512: 2, 1024: 4, 2048: 1, 8192: 1}
    assert {mb: config.divisions(mb * MiB) for mb in expected} == expected
    gaps = AllocatorConfig.from_env_string("roundup_power2_divisions:[128:8,256:16,512:1,2048:8,>:2]")
    assert [gaps.divisions(mb * MiB) for mb in (64, 256, 1024, 2048, 4096)] == [8, 16, 0, 8, 2]
    assert round_size(100 * MiB + 1, config) == 104 * MiB  # [64, 128) MiB in eighths
    # Sizes past the last interval ([32 GiB, 64 GiB)) use its divisions: 100 GiB in quarters of 64 GiB.
    last = AllocatorConfig.from_env_string("roundup_power2_divisions:[1:2,>:4]")
    assert round_size(40 * GiB + 1, last) == 48 * GiB
    assert round_size(100 * GiB + 1, last) == 112 * GiB


def test_expandable_segment_grows_by_pages_and_carves_blocks():
    alloc = CudaCachingAllocator(AllocatorConfig(expandable_segments=True))
    # 5 MiB: a new large-pool range; one 20 MiB page is mapped; split (remainder >= 512).
    alloc.malloc("a", 5 * MiB)
    assert (alloc.reserved_bytes, alloc.allocated_bytes) == (20 * MiB, 5 * MiB)
    # 30 MiB: the free 15 MiB tail plus one more mapped page (35 MiB) is carved: 5 MiB stay free.
    alloc.malloc("b", 30 * MiB)
    assert (alloc.reserved_bytes, alloc.allocated_bytes) == (40 * MiB, 35 * MiB)
    assert blocks(alloc) == [[(5 * MiB, True), (30 * MiB, True), (5 * MiB, False)]]
    assert alloc.num_segments == 0  # segment.all counts cudaMalloc segments only
    # Without expandable segments: 20 MiB + a 30 MiB segment.
    plain = replay([SimpleNamespace(action="alloc", nbytes=n, key=k) for k, n in (("a", 5 * MiB), ("b", 30 * MiB))])
    assert plain.reserved_bytes == 50 * MiB
    # Small pool pages are 2 MiB.
    alloc.malloc("s", 1)
    assert alloc.memory_stats()["reserved_bytes.small_pool.current"] == 2 * MiB


def test_expandable_segment_unmaps_only_whole_free_pages_on_empty_cache():
    alloc = CudaCachingAllocator(AllocatorConfig(expandable_segments=True))
    alloc.malloc("a", 25 * MiB)  # two 20 MiB pages mapped; [25 used][15 free]
    alloc.free("a")
    assert alloc.reserved_bytes == 40 * MiB  # frees keep pages mapped
    alloc.malloc("b", 25 * MiB)
    alloc.empty_cache()  # the free 15 MiB holds no whole page: nothing unmapped
    assert alloc.reserved_bytes == 40 * MiB
    alloc.free("b")
    alloc.empty_cache()  # now both pages are free: unmapped, the range is dropped
    assert alloc.reserved_bytes == 0 and alloc.snapshot() == []


def test_empty_cache_releases_only_fully_free_segments():
    alloc = CudaCachingAllocator()
    alloc.malloc("a", 5 * MiB)  # 20 MiB segment, split
    alloc.malloc("b", 30 * MiB)  # its own 30 MiB segment
    alloc.free("b")
    alloc.empty_cache()  # the 30 MiB segment is whole and free; the 20 MiB one still holds a
    assert (alloc.reserved_bytes, alloc.num_segments) == (20 * MiB, 1)
    alloc.free("a")
    alloc.empty_cache()
    assert alloc.reserved_bytes == 0
    assert alloc.peak_reserved_bytes == 50 * MiB


def test_oom_retries_after_releasing_cached_segments_then_raises():
    alloc = CudaCachingAllocator(capacity_bytes=40 * MiB)
    alloc.malloc("a", 30 * MiB)
    alloc.free("a")  # 30 MiB cached
    # 32 MiB: no cached fit; 30 + 32 > 40 fails; release_cached_blocks frees the 30 MiB; retry fits.
    alloc.malloc("b", 32 * MiB)
    assert alloc.reserved_bytes == 32 * MiB
    assert alloc.memory_stats()["num_alloc_retries"] == 1
    # 10 MiB: a 10 MiB segment; 32 + 10 > 40 and nothing is cached: out of memory.
    with pytest.raises(CudaOutOfMemoryError):
        alloc.malloc("c", 10 * MiB)
    assert alloc.memory_stats()["num_ooms"] == 1
    assert (alloc.allocated_bytes, alloc.reserved_bytes) == (32 * MiB, 32 * MiB)


def test_oom_path_first_releases_just_enough_oversize_blocks():
    # max_split_size 20 MiB: three cached 24 MiB segments are oversize. 30 MiB does not fit beside
    # them (2 + 72 + 30 > 80); release_available_cached_blocks frees the largest of this stream
    # until 30 MiB are freed (two of them, 48 MiB) and the retry fits without a full release.
    alloc = CudaCachingAllocator(AllocatorConfig(max_split_size=20 * MiB), capacity_bytes=80 * MiB)
    alloc.malloc("small", 1)  # a 2 MiB small segment that this path never touches
    for key in "xyw":
        alloc.malloc(key, 24 * MiB)
    for key in "xyw":
        alloc.free(key)
    alloc.malloc("z", 30 * MiB)
    assert alloc.reserved_bytes == (2 + 24 + 30) * MiB
    assert alloc.memory_stats()["num_alloc_retries"] == 0  # counted only for the full release


def test_garbage_collection_with_memory_fraction():
    # fraction 0.5 of 100 MiB allows 50 MiB; GC threshold 0.5 of that is 25 MiB. The cached 30 MiB
    # block is older than the average (the only one), so GC frees it before cudaMalloc: no retry.
    config = AllocatorConfig.from_env_string("per_process_memory_fraction:0.5,garbage_collection_threshold:0.5")
    alloc = CudaCachingAllocator(config, capacity_bytes=100 * MiB)
    alloc.malloc("a", 30 * MiB)
    alloc.free("a")
    alloc.malloc("b", 40 * MiB)
    assert alloc.reserved_bytes == 40 * MiB
    assert alloc.memory_stats()["num_alloc_retries"] == 0
    # The same without GC reaches 30 + 40 > 50, so release_cached_blocks and a retry are needed.
    alloc = CudaCachingAllocator(AllocatorConfig(per_process_memory_fraction=0.5), capacity_bytes=100 * MiB)
    alloc.malloc("a", 30 * MiB)
    alloc.free("a")
    alloc.malloc("b", 40 * MiB)
    assert alloc.memory_stats()["num_alloc_retries"] == 1


def test_peaks_fragmentation_and_snapshot_at_peak():
    alloc = CudaCachingAllocator(snapshot_at_peak=True)
    alloc.malloc("a", 5 * MiB)  # allocated 5, reserved 20
    alloc.free("a")
    alloc.malloc("b", 30 * MiB)  # allocated 30, reserved 50 (the 20 MiB segment stays cached)
    alloc.free("b")
    alloc.malloc("c", 5 * MiB)
    assert (alloc.peak_allocated_bytes, alloc.peak_reserved_bytes) == (30 * MiB, 50 * MiB)
    assert alloc.fragmentation.at_allocated_peak == 20 * MiB
    assert alloc.fragmentation.at_reserved_peak == 20 * MiB
    assert [seg.allocated_size for seg in alloc.peak_snapshot] == [0, 30 * MiB]
    assert alloc.peak_snapshot[1].blocks[0].key == "b"


def test_settings_parse_and_bad_settings_name_the_key():
    text = "max_split_size_mb:128, roundup_power2_divisions:4,expandable_segments:True"
    config = AllocatorConfig.from_env_string(text)
    assert config.max_split_size == 128 * MiB and config.expandable_segments
    assert config.max_non_split_rounding_size == 20 * MiB  # defaults to large_segment_size
    wide = AllocatorConfig.from_env_string("large_segment_size_mb:30")
    assert get_allocation_size(5 * MiB, wide) == 30 * MiB
    bad = {
        "max_split_size_mb:10": "max_split_size_mb",  # below large_segment_size (20 MB)
        "max_split_size_mb:20,large_segment_size_mb:25": "max_split_size_mb",
        "foo:1": "foo",
        "expandable_segments:true": "expandable_segments",  # toBool wants True / False
        "roundup_power2_divisions:3": "roundup_power2_divisions",
        "roundup_power2_divisions:[64:8": "roundup_power2_divisions",
        "garbage_collection_threshold:1.5": "garbage_collection_threshold",
        "max_split_size_mb": "max_split_size_mb",
    }
    for text, key in bad.items():
        with pytest.raises(ValueError) as info:
            AllocatorConfig.from_env_string(text)
        assert key in str(info.value) and "\n" not in str(info.value), text


@pytest.mark.parametrize("settings", ["", "max_split_size_mb:40", "expandable_segments:True",
                                      "roundup_power2_divisions:[1:4,>:2],max_split_size_mb:64"])
def test_random_sequences_keep_the_segment_map_consistent(settings):
    # Invariants of any state: segments tile their blocks contiguously; no two free blocks touch
    # (free_block merges them); reserved = the segments' (mapped) sizes; allocated = live blocks.
    import random

    rng = random.Random(7)
    alloc = CudaCachingAllocator(AllocatorConfig.from_env_string(settings) if settings else AllocatorConfig(),
                                 capacity_bytes=600 * MiB)
    live = []
    for step in range(1500):
        if live and rng.random() < 0.45:
            alloc.free(live.pop(rng.randrange(len(live))))
        else:
            size = rng.choice([rng.randrange(1, 4096), rng.randrange(1, 2 * MiB), rng.randrange(1, 60 * MiB)])
            try:
                alloc.malloc(step, size, stream=rng.randrange(2))
                live.append(step)
            except CudaOutOfMemoryError:
                pass
        if step % 50 == 0 or step == 1499:
            segments = alloc.snapshot()
            for seg in segments:
                for a, b in zip(seg.blocks, seg.blocks[1:]):
                    assert a.address + a.size == b.address
                    assert a.state == "active_allocated" or b.state == "active_allocated"
            assert sum(seg.total_size for seg in segments) == alloc.reserved_bytes
            assert alloc.allocated_bytes == sum(b.size for seg in segments for b in seg.blocks if b.key is not None)
            assert alloc.reserved_bytes <= 600 * MiB
