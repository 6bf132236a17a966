"""The GPU catalog: sourced capacities, compute-capability rules and custom devices. No torch."""

from __future__ import annotations

import pytest

from trainmem.device_catalog import (CATALOG, CUBLAS_DEFAULT_WORKSPACE, CUBLAS_LARGE_WORKSPACE,
                                     DEFAULT_CONTEXT_BYTES, GpuSpec, find_gpu, parse_custom)
from trainmem.errors import SetupError


def test_constants_match_pytorch_source():
    assert CUBLAS_DEFAULT_WORKSPACE == 8_519_680  # ":4096:2:16:8"
    assert CUBLAS_LARGE_WORKSPACE == 32 * 1024**2


@pytest.mark.parametrize("spec", CATALOG, ids=lambda s: s.name)
def test_entry_is_sourced_and_consistent(spec: GpuSpec):
    assert spec.capacity_source.strip() and ("github.com" in spec.capacity_source or "http" in spec.capacity_source)
    assert spec.context_source.strip()
    assert spec.capacity_bytes > 0 and spec.capacity_bytes % 1024**2 == 0
    assert spec.cuda_context_bytes > 0
    major, minor = spec.compute_capability
    assert spec.bf16 == (major >= 8)
    assert spec.flash_attention == ((8, 0) <= (major, minor) <= (12, 1))
    expected = CUBLAS_LARGE_WORKSPACE if major in (9, 10, 11, 12) else CUBLAS_DEFAULT_WORKSPACE
    assert spec.cublas_workspace_bytes == expected


def test_names_and_aliases_are_unique():
    keys = [k for s in CATALOG for k in (s.name, *s.aliases)]
    assert len(keys) == len(set(keys))
    assert all(k == k.lower() for k in keys)


def test_known_entries():
    assert find_gpu("t4").capacity_bytes == 15360 * 1024**2
    assert find_gpu("a100-40gb").capacity_bytes == 40960 * 1024**2
    assert find_gpu("h100-80gb").cublas_workspace_bytes == 32 * 1024**2
    assert find_gpu("v100-16gb").flash_attention is False and find_gpu("v100-16gb").bf16 is False
    assert find_gpu("t4").cublas_workspace_bytes == 8_519_680


@pytest.mark.parametrize("text,name", [("T4", "t4"), ("Tesla-T4", "t4"), ("A100_SXM4_80GB", "a100-80gb"),
                                        (" H100-SXM ", "h100-80gb"), ("4090", "rtx4090"), ("A10", "a10g")])
def test_find_gpu_aliases(text, name):
    assert find_gpu(text).name == name


def test_find_gpu_unknown():
    assert find_gpu("tpu-v5") is None


def test_parse_custom_good():
    spec = parse_custom("custom:capacity=24GiB,cc=8.9")
    assert spec.capacity_bytes == 24 * 1024**3
    assert spec.compute_capability == (8, 9)
    assert spec.bf16 and spec.flash_attention
    assert spec.cublas_workspace_bytes == 8_519_680
    assert spec.cuda_context_bytes == DEFAULT_CONTEXT_BYTES and not spec.context_given
    spec = parse_custom("CUSTOM:cc=9.0, capacity=80GB, context=500MiB")
    assert spec.capacity_bytes == 80 * 1000**3
    assert spec.cuda_context_bytes == 500 * 1024**2 and spec.context_given
    assert spec.cublas_workspace_bytes == 32 * 1024**2
    old = parse_custom("custom:capacity=12GiB,cc=7.5")
    assert not old.bf16 and not old.flash_attention


@pytest.mark.parametrize("text", ["custom:", "custom:capacity=24GiB", "custom:cc=8.9",
                                  "custom:capacity=lots,cc=8.9", "custom:capacity=24GiB,cc=eight",
                                  "custom:capacity=24GiB,cc=8", "custom:capacity=24GiB,cc=8.9,color=red",
                                  "custom:capacity=24GiB,cc=8.9,cc=9.0", "capacity=24GiB,cc=8.9",
                                  "custom:capacity=0,cc=8.9", "custom:capacity=24GiB,cc=8.9,context=x"])
def test_parse_custom_bad(text):
    with pytest.raises(SetupError) as info:
        parse_custom(text)
    message = str(info.value)
    assert message.startswith("--device: expected") and "got" in message and "\n" not in message


def test_default_context_is_the_cuda12_lazy_figure():
    from trainmem.targets.cuda_runtime import context_fact, resolve_runtime

    assert DEFAULT_CONTEXT_BYTES == context_fact(resolve_runtime("12.8", "lazy", None)).point == 256 * 1024**2


def test_a_custom_context_is_used_as_is():
    """context= on a custom device replaces the runtime's figure and its range (point = high)."""
    from trainmem import estimate

    est = estimate("mlp:8-8", device="custom:capacity=8GiB,cc=8.0,context=100MiB", batch_size=2, input_shape="8")
    assert est.process_parts["cuda_context"] == 100 * 1024**2
    assert est.process_bytes_high == est.process_bytes == est.reserved_bytes + 100 * 1024**2
