"""PYTORCH_CUDA_ALLOC_CONF (or PYTORCH_ALLOC_CONF) settings for the CUDA caching allocator model:
parsed as AcceleratorAllocatorConfig::parseArgs / CUDAAllocatorConfig do (c10/core/AllocatorConfig.cpp,
c10/cuda/CUDAAllocatorConfig.h). Bytes, not MB, once parsed. No torch."""

from __future__ import annotations

import dataclasses

MiB = 1 << 20
K_LARGE_BUFFER = 20 * MiB  # kLargeBuffer: default large_segment_size
K_MIN_LARGE_ALLOC = 10 * MiB  # kMinLargeAlloc
SIZE_MAX = 2**64 - 1  # max_split_size when unset (std::numeric_limits<size_t>::max())
INTERVALS = 16  # kRoundUpPowerOfTwoIntervals: [1 MiB, 2 MiB) ... [32 GiB, 64 GiB)


@dataclasses.dataclass(frozen=True)
class AllocatorConfig:
    """PYTORCH_ALLOC_CONF / PYTORCH_CUDA_ALLOC_CONF settings; bytes, not MB."""

    max_split_size: int = SIZE_MAX
    max_non_split_rounding_size: int | None = None  # None: large_segment_size, as parseArgs sets it
    roundup_power2_divisions: int | tuple[int, ...] = 0  # one value, or one per interval (16)
    garbage_collection_threshold: float = 0.0
    expandable_segments: bool = False
    large_segment_size: int = K_LARGE_BUFFER
    per_process_memory_fraction: float = 1.0
    backend: str = "native"

    def __post_init__(self) -> None:
        divisions = self.roundup_power2_divisions
        if isinstance(divisions, int):
            divisions = (divisions,) * INTERVALS
        divisions = tuple(divisions)
        if len(divisions) != INTERVALS or any(d < 0 or d & (d - 1) for d in divisions):
            raise ValueError(f"roundup_power2_divisions: expected 0 or powers of 2, one or {INTERVALS}, "
                             f"got {divisions}")
        object.__setattr__(self, "roundup_power2_divisions", divisions)
        if self.max_non_split_rounding_size is None:
            object.__setattr__(self, "max_non_split_rounding_size", self.large_segment_size)
        # The parser's minimums (parseMaxSplitSize, parseMaxNonSplitRoundingSize, parseLargeSegmentSize).
        for name in ("max_split_size", "max_non_split_rounding_size"):
            if getattr(self, name) < self.large_segment_size:
                raise ValueError(f"{name}: expected >= large_segment_size ({self.large_segment_size}), "
                                 f"got {getattr(self, name)}")
        if self.large_segment_size <= K_MIN_LARGE_ALLOC:
            raise ValueError(f"large_segment_size: expected > 10 MiB, got {self.large_segment_size}")

    def divisions(self, size: int) -> int:
        """AcceleratorAllocatorConfig::roundup_power2_divisions(size): the size's 1 MiB-based interval."""
        index = max(size.bit_length() - 1 - 20, 0)
        return self.roundup_power2_divisions[min(index, INTERVALS - 1)]

    @classmethod
    def from_env_string(cls, text: str) -> AllocatorConfig:
        """Parse 'key:value,key:[a:b,>:c]' as AcceleratorAllocatorConfig::parseArgs does."""
        return _parse_settings(text)


def _tokenize(text: str) -> list[str]:
    """ConfigTokenizer: ',', ':', '[' and ']' are tokens of their own; whitespace is dropped."""
    tokens, buffer = [], ""
    for ch in text:
        if ch in ",:[]":
            if buffer:
                tokens.append(buffer)
                buffer = ""
            tokens.append(ch)
        elif not ch.isspace():
            buffer += ch
    return tokens + [buffer] if buffer else tokens


def _split_pairs(text: str) -> list[tuple[str, str | list[str]]]:
    """The (key, value) pairs; a bracketed value is kept as its list of tokens."""
    tokens, pairs, i = _tokenize(text), [], 0
    while i < len(tokens):
        key = tokens[i]
        if i + 2 >= len(tokens) or tokens[i + 1] != ":" or tokens[i + 2] in ",:]":
            raise ValueError(f"allocator setting {key!r}: expected '{key}:value' in {text!r}")
        if tokens[i + 2] == "[":
            end = tokens.index("]", i + 2) if "]" in tokens[i + 2 :] else -1
            if end < 0:
                raise ValueError(f"allocator setting {key!r}: missing ']' in {text!r}")
            value: str | list[str] = tokens[i + 3 : end]
            i = end + 1
        else:
            value, i = tokens[i + 2], i + 3
        if i < len(tokens) and tokens[i] != ",":
            raise ValueError(f"allocator setting {key!r}: expected ',' after its value in {text!r}")
        pairs.append((key, value))
        i += 1
    return pairs


def power_of_two(value: int) -> bool:
    return value > 0 and not value & (value - 1)


def _parse_divisions(value: str | list[str]) -> tuple[int, ...]:
    """parseRoundUpPower2Divisions. A list entry 'N:d' sets the interval starting at N MiB (index
    log2 N, clamped to 15); the first entry also fills every interval below it; '>:d' fills every
    interval after the last one named. Intervals left unnamed between entries keep 0 (no rounding)."""
    if isinstance(value, str):
        if not power_of_two(int(value)):
            raise ValueError("divisions must be a power of 2")
        return (int(value),) * INTERVALS
    divisions, last, first = [0] * INTERVALS, 0, True
    entries = [e for e in value if e != ","]
    if len(entries) % 3 or any(entries[k + 1] != ":" for k in range(0, len(entries), 3)):
        raise ValueError("expected [size_mb:divisions, ..., >:divisions]")
    for k in range(0, len(entries), 3):
        boundary, d = entries[k], int(entries[k + 2])
        if d and not power_of_two(d):
            raise ValueError("divisions must be 0 or a power of 2")
        if boundary == ">":
            divisions[last + 1 :] = [d] * (INTERVALS - last - 1)
            continue
        if not power_of_two(int(boundary)):
            raise ValueError("interval sizes must be powers of 2")
        index = min(int(boundary).bit_length() - 1, INTERVALS - 1)
        if first:
            divisions[:index] = [d] * index
            first = False
        divisions[index], last = d, index
    return tuple(divisions)


def _parse_bool(value: str | list[str]) -> bool:
    if value not in ("True", "False"):  # ConfigTokenizer::toBool is case-sensitive
        raise ValueError("expected True or False")
    return value == "True"


_IGNORED = {  # CUDAAllocatorConfig / host-allocator keys with no effect on device memory figures
    "release_lock_on_cudamalloc", "release_lock_on_hipmalloc", "pinned_use_cuda_host_register",
    "pinned_use_hip_host_register", "pinned_num_register_threads", "pinned_use_background_threads",
    "pinned_reserve_segment_size_mb", "pinned_free_catch_all", "graph_capture_record_stream_reuse",
    "throw_on_cudamalloc_oom",
}


def _parse_settings(text: str) -> AllocatorConfig:
    pairs = _split_pairs(text)
    kwargs: dict[str, object] = {}
    # large_segment_size_mb is read first (a pass of its own in parseArgs): the minimums of
    # max_split_size_mb and max_non_split_rounding_mb are this size.
    order = sorted(pairs, key=lambda pair: pair[0] != "large_segment_size_mb")
    for key, value in order:
        try:
            large = int(kwargs.get("large_segment_size", K_LARGE_BUFFER))  # type: ignore[call-overload]
            kwargs.update(_parse_one(key, value, large))
        except (ValueError, TypeError) as err:
            raise ValueError(f"allocator setting {key!r}: {err} (in {text!r})") from None
    return AllocatorConfig(**kwargs)


def _parse_one(key: str, value: str | list[str], large: int) -> dict[str, object]:
    scalar = value if isinstance(value, str) else None
    if key == "roundup_power2_divisions":
        return {"roundup_power2_divisions": _parse_divisions(value)}
    if key == "expandable_segments":
        return {"expandable_segments": _parse_bool(value)}
    if key in _IGNORED:
        return {}
    if scalar is None:
        raise ValueError("expected a single value")
    if key == "large_segment_size_mb":
        if int(scalar) * MiB <= K_MIN_LARGE_ALLOC:
            raise ValueError("must be > 10 MB")
        return {"large_segment_size": int(scalar) * MiB}
    if key in ("max_split_size_mb", "max_non_split_rounding_mb"):
        if int(scalar) * MiB < large:
            raise ValueError(f"too small, must be >= {large // MiB}")
        field = "max_split_size" if key == "max_split_size_mb" else "max_non_split_rounding_size"
        return {field: min(int(scalar), SIZE_MAX // MiB) * MiB}
    if key == "garbage_collection_threshold":
        if not 0.0 < float(scalar) < 1.0:
            raise ValueError("must be in (0.0, 1.0)")
        return {"garbage_collection_threshold": float(scalar)}
    if key == "per_process_memory_fraction":
        if not 0.0 <= float(scalar) <= 1.0:
            raise ValueError("must be in [0.0, 1.0]")
        return {"per_process_memory_fraction": float(scalar)}
    if key == "backend":
        if scalar not in ("native", "cudaMallocAsync"):
            raise ValueError("expected native or cudaMallocAsync")
        return {"backend": scalar}
    raise ValueError("unrecognized key")
