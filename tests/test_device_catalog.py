"""The GPU catalog: sourced capacities, compute-capability rules and custom devices. No torch."""

from __future__ import annotations

import pytest

import json
import re

from trainmem.cli import main
from trainmem.device_catalog import (CAPACITY_FROM_DATASHEET, CAPACITY_FROM_GIVEN, CAPACITY_FROM_NVIDIA_SMI,
                                     CAPACITY_FROM_TORCH, CATALOG, CONTEXT_ASSUMED, CONTEXT_GIVEN, CONTEXT_MEASURED,
                                     CONTEXT_NOT_MODELLED, CUBLAS_DEFAULT_WORKSPACE, CUBLAS_LARGE_WORKSPACE,
                                     DEFAULT_CONTEXT_BYTES, DEFAULT_CONTEXT_MEASURED_ON, PLATFORM_CUDA, PLATFORM_ROCM,
                                     GpuSpec, find_gpu, parse_custom)
from trainmem.devices import GpuProperties, all_devices, format_table, get_device, gpu_device, identify_gpu
from trainmem.errors import SetupError

MiB = 1024**2


def test_constants_match_pytorch_source():
    assert CUBLAS_DEFAULT_WORKSPACE == 8_519_680  # ":4096:2:16:8"
    assert CUBLAS_LARGE_WORKSPACE == 32 * 1024**2


@pytest.mark.parametrize("spec", CATALOG, ids=lambda s: s.name)
def test_entry_is_sourced_and_consistent(spec: GpuSpec):
    assert spec.capacity_source.strip() and ("github.com" in spec.capacity_source or "http" in spec.capacity_source)
    assert spec.context_source.strip() and "http" in spec.arch_source
    # the source says how the figure was obtained, and the entry says whether that is a measurement
    assert spec.capacity_from in (CAPACITY_FROM_NVIDIA_SMI, CAPACITY_FROM_TORCH, CAPACITY_FROM_DATASHEET)
    said = {CAPACITY_FROM_NVIDIA_SMI: "nvidia-smi", CAPACITY_FROM_TORCH: "torch total_memory",
            CAPACITY_FROM_DATASHEET: "datasheet, not measured"}[spec.capacity_from]
    assert spec.capacity_source.startswith(said)
    assert spec.capacity_measured == (spec.capacity_from != CAPACITY_FROM_DATASHEET)
    assert spec.capacity_bytes > 0
    if spec.capacity_from != CAPACITY_FROM_TORCH:  # nvidia-smi prints whole MiB; a datasheet's GB is read as GiB
        assert spec.capacity_bytes % 1024**2 == 0
    if spec.platform == PLATFORM_ROCM:  # listed for its capacity: none of the CUDA runtime's figures
        assert (spec.context_from, spec.cuda_context_bytes, spec.cublas_workspace_bytes) == (CONTEXT_NOT_MODELLED, 0, 0)
        assert spec.sm_count is None and spec.gfx_target.startswith("gfx") and not spec.modelled
        return
    assert spec.platform == PLATFORM_CUDA and spec.modelled and spec.sm_count > 0
    assert spec.context_from == (CONTEXT_MEASURED if spec.name == DEFAULT_CONTEXT_MEASURED_ON else CONTEXT_ASSUMED)
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
                                        (" H100-SXM ", "h100-80gb"), ("4090", "rtx4090"), ("A10", "a10"),
                                        ("A10G", "a10g"), ("3060", "rtx3060-12gb"), ("RTX_3060", "rtx3060-12gb"),
                                        ("MI300X", "mi300x")])
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
                                  "custom:capacity=0,cc=8.9", "custom:capacity=24GiB,cc=8.9,context=x",
                                  # bounds: beyond 1 PiB, compute capabilities no GPU has, a context the card cannot hold
                                  "custom:capacity=100000000TiB,cc=8.0", "custom:capacity=24GiB,cc=99.9",
                                  "custom:capacity=24GiB,cc=2.1", "custom:capacity=24GiB,cc=8.10",
                                  "custom:capacity=24GiB,cc=8.9,context=24GiB"])
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


@pytest.mark.parametrize("text, cc", [("custom:capacity=1024TiB,cc=3.0", (3, 0)), ("custom:capacity=8GiB,cc=12.9", (12, 9))])
def test_parse_custom_bounds_are_inclusive(text, cc):
    spec = parse_custom(text)
    assert spec.compute_capability == cc and spec.capacity_bytes <= 2**50


def test_custom_devices_say_their_figures_were_given():
    spec = parse_custom("custom:capacity=24GiB,cc=8.9,context=300MiB")
    assert (spec.capacity_from, spec.context_from, spec.capacity_measured) == (CAPACITY_FROM_GIVEN, CONTEXT_GIVEN, False)
    assert parse_custom("custom:capacity=24GiB,cc=8.9").context_from == CONTEXT_ASSUMED


# GPUs clouds rent that the catalog lacked before: (name, capacity in MiB, compute capability, capacity from)
ADDED = [("h200", 141 * 1024, (9, 0), CAPACITY_FROM_DATASHEET), ("gb200", 186 * 1024, (10, 0), CAPACITY_FROM_DATASHEET),
         ("h100-nvl", 95830, (9, 0), CAPACITY_FROM_NVIDIA_SMI), ("rtx-6000-ada", 49140, (8, 9), CAPACITY_FROM_NVIDIA_SMI),
         ("a40", 46068, (8, 6), CAPACITY_FROM_NVIDIA_SMI)]


@pytest.mark.parametrize("name, mib, cc, source", ADDED, ids=[row[0] for row in ADDED])
def test_added_gpus(name, mib, cc, source):
    spec = find_gpu(name)
    assert (spec.capacity_bytes, spec.compute_capability, spec.capacity_from) == (mib * MiB, cc, source)
    assert spec.cublas_workspace_bytes == (CUBLAS_LARGE_WORKSPACE if cc[0] >= 9 else CUBLAS_DEFAULT_WORKSPACE)


def test_datasheet_capacities_state_the_assumption():
    """A capacity resting on a datasheet says so: its source names the vendor's page, the reading as GiB, and that
    it is not measured, and the JSON says so too. The HBM boards without a measured total are H200 and GB200."""
    datasheet = [spec for spec in CATALOG if spec.capacity_from == CAPACITY_FROM_DATASHEET]
    assert {"h200", "gb200", "mi300x", "mi250"} <= {spec.name for spec in datasheet}
    for spec in datasheet:
        source = spec.capacity_source
        assert "not measured" in source and "GiB" in source
        assert "https://www.nvidia.com/" in source or "https://rocm.docs.amd.com/" in source
        listed = gpu_device(spec).to_dict()
        assert listed["capacity_from"] == "datasheet" and listed["capacity_measured"] is False


def test_devices_table_is_aligned_with_a_header():
    """Every column starts at the same offset on every row, header included; the table names each
    capacity's source and says what the "from" words mean."""
    text = format_table(all_devices())
    rows = text.split("\n\n")[0].splitlines()
    header, body = rows[0], rows[1:]
    assert header.split("  ")[0] == "name" and "capacity from" in header and "context from" in header
    assert [row.split()[0] for row in body] == [device.name for device in all_devices()]

    def starts(line: str) -> list[int]:  # a cell starts after two spaces (cells hold single spaces only)
        return [0] + [match.end() for match in re.finditer(r"  +", line.rstrip())]

    columns = starts(header)
    assert all(starts(row) == columns for row in body), "\n".join(rows)
    for spec in CATALOG:
        assert spec.capacity_source in text
    assert "datasheet = the vendor's published figure" in text and "assumed = measured on another GPU" in text
    assert "kind rocm: an AMD GPU, listed for its capacity" in text
    h200 = next(row for row in body if row.startswith("h200 "))
    assert "datasheet" in h200 and "141.00 GiB" in h200


def test_devices_json_has_integer_bytes_and_sources(capsys):
    assert main(["devices", "--format", "json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    names = [d["name"] for d in listed]
    assert {"h200", "gb200", "h100-nvl"} <= set(names)
    for device in listed:
        byte_values = [v for k, v in device.items() if k.endswith("_bytes")]
        assert byte_values and all(type(v) is int for v in byte_values)
        if device["kind"] == "cuda":
            assert device["capacity_source"] and device["context_source"]
            assert device["capacity_from"] in ("nvidia-smi", "torch", "datasheet")
            assert device["context_from"] in ("measured", "assumed")


@pytest.mark.parametrize("name", ["h200", "gb200", "h100-nvl"])
def test_estimates_run_on_the_added_gpus(name, capsys):
    code = main(["estimate", "mlp:64-32-8", "--input-shape", "64", "--batch-size", "4", "--device", name,
                 "--format", "json"])
    result = json.loads(capsys.readouterr().out)
    assert code == 0 and result["device"]["name"] == name and result["fits"] is True
    assert result["device"]["capacity_bytes"] == find_gpu(name).capacity_bytes
    assert result["peak"]["process_bytes"] > result["peak"]["reserved_bytes"] >= result["peak"]["allocated_bytes"] > 0


@pytest.mark.parametrize("torch_name, entry", [("NVIDIA H100 80GB HBM3", "h100-80gb"), ("Tesla T4", "t4"),
                                               ("NVIDIA A100-SXM4-80GB", "a100-80gb"),
                                               ("NVIDIA GeForce RTX 4090", "rtx4090")])
def test_a_visible_gpu_is_identified_by_its_name(torch_name, entry):
    """torch.cuda.get_device_properties().name is nvidia-smi's product name, which each entry records; torch's
    total_memory is a little under nvidia-smi's total."""
    spec = identify_gpu(GpuProperties(0, torch_name, find_gpu(entry).capacity_bytes - 470 * MiB, (9, 0)))
    assert spec is find_gpu(entry)


def test_a_visible_gpu_measures_what_the_catalog_only_has_from_a_datasheet():
    spec = identify_gpu(GpuProperties(0, "NVIDIA H200", 150_109_011_968, (9, 0)))
    assert (spec.name, spec.capacity_bytes, spec.capacity_from) == ("h200", 150_109_011_968, CAPACITY_FROM_TORCH)
    assert spec.capacity_measured and "measured on this machine" in spec.capacity_source


def test_a_gpu_the_catalog_lacks_is_described_by_its_properties():
    """An A100 PCIe or a MIG slice: torch's total_memory is the capacity, its compute capability the rules'."""
    spec = identify_gpu(GpuProperties(1, "NVIDIA A100-SXM4-80GB MIG 1g.10gb", 9_961_472_000, (8, 0)))
    assert (spec.name, spec.capacity_bytes, spec.compute_capability) == ("cuda:1", 9_961_472_000, (8, 0))
    assert spec.capacity_from == CAPACITY_FROM_TORCH and spec.bf16 and spec.flash_attention
    assert spec.cublas_workspace_bytes == CUBLAS_DEFAULT_WORKSPACE and "total_memory" in spec.capacity_source


def test_cuda_names_this_machines_gpu(monkeypatch):
    """"cuda", "cuda:N" and torch.device("cuda", N) are this machine's GPU: identified where torch sees one."""
    import torch

    import trainmem.devices as devices

    seen = []

    def visible(index):
        seen.append(index)
        return GpuProperties(index, "NVIDIA L4", 23_580_639_232, (8, 9))

    monkeypatch.setattr(devices, "_visible_gpu", visible)
    assert get_device("cuda").name == "l4" and get_device(torch.device("cuda", 3)).name == "l4"
    assert get_device("CUDA:2").gpu is find_gpu("l4")
    assert seen == [0, 3, 2]


def test_cuda_without_a_visible_gpu_asks_for_the_model(monkeypatch):
    import torch

    import trainmem.devices as devices

    monkeypatch.setattr(devices, "_visible_gpu", lambda index: None)
    for given in ("cuda", "cuda:1", torch.device("cuda"), torch.device("cuda", 0)):
        with pytest.raises(SetupError) as info:
            get_device(given)
        message = str(info.value)
        assert message.startswith("--device: expected the GPU model") and "h100-80gb" in message
        assert "no CUDA GPU is visible" in message and "\n" not in message


def test_cuda_on_this_machine():
    """Without monkeypatching: on this machine (no GPU in the test environment) "cuda" is refused on one line;
    on a machine with one, it is identified."""
    import torch

    if torch.cuda.is_available():
        assert get_device("cuda").kind == "cuda"
    else:
        with pytest.raises(SetupError, match="no CUDA GPU is visible"):
            get_device(torch.device("cuda"))


@pytest.mark.parametrize("given", [42, None, 3.5, ["h200"]])
def test_a_device_of_another_type_is_refused(given):
    with pytest.raises(SetupError) as info:
        get_device(given)
    assert str(info.value).startswith("--device: expected a device") and "torch.device" in str(info.value)


def test_a_datasheet_capacity_is_named_in_the_report():
    from trainmem import estimate

    text = str(estimate("mlp:8-8", device="gb200", batch_size=2, input_shape="8"))
    assert "device gb200 (186.00 GiB: the datasheet's figure, not a measured total)" in text
    assert "not a measured total" not in str(estimate("mlp:8-8", device="b200", batch_size=2, input_shape="8"))
