"""The GPUs people own in the catalog, `trainmem devices --search`, and AMD Instinct GPUs refused for estimates."""

from __future__ import annotations

import json

import pytest

from trainmem.cli import main
from trainmem.device_catalog import CAPACITY_FROM_TORCH, CATALOG, PLATFORM_ROCM, find_gpu
from trainmem.devices import GpuProperties, all_devices, get_device, identify_gpu, search_devices
from trainmem.errors import SetupError

MiB = 1024**2

# Issue 21 item 8: the consumer, workstation, datacenter and AMD Instinct GPUs users ask about
ASKED_FOR = ["rtx2060", "rtx2070", "rtx2080", "rtx2080ti", "rtx3060-12gb", "rtx3060ti", "rtx3070", "rtx3080",
             "rtx3080ti", "rtx3090", "rtx3090ti", "rtx4060", "rtx4060ti-16gb", "rtx4070", "rtx4070ti-super", "rtx4080",
             "rtx4090", "rtx5060ti-16gb", "rtx5070", "rtx5070ti", "rtx5080", "rtx5090", "rtx-a4000", "rtx-a4500",
             "rtx-a5000", "rtx-a6000", "rtx-6000-ada", "p100", "v100-16gb", "v100-32gb", "t4", "a10", "a10g", "l4",
             "l40s", "a100-40gb", "a100-80gb", "h100-pcie", "h100-sxm", "h100-nvl", "h200", "b200", "gb200", "mi250",
             "mi300x"]


def run(args, capsys):
    code = main(args)
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize("name", ASKED_FOR)
def test_the_gpus_people_ask_about_are_in_the_catalog_with_a_source_and_a_capacity(name):
    spec = find_gpu(name)
    assert spec is not None and spec.capacity_bytes > 0 and "http" in spec.capacity_source
    assert "http" in spec.arch_source


# (key, capacity in bytes, compute capability, SMs): each figure checked against its source's text
ADDED = [("rtx3060-12gb", 12288 * MiB, (8, 6), 28), ("rtx4060ti-16gb", 16380 * MiB, (8, 9), 34),
         ("rtx4070ti-super", 17_170_956_288, (8, 9), 66), ("rtx5070", 12227 * MiB, (12, 0), 48),
         ("rtx5060ti-16gb", 16311 * MiB, (12, 0), 36), ("rtx-a4000", 16376 * MiB, (8, 6), 48),
         ("rtx-a5000", 24564 * MiB, (8, 6), 64), ("p100-16gb", 16384 * MiB, (6, 0), 56),
         ("a10", 23028 * MiB, (8, 6), 72), ("rtx2080ti", 11 * 1024 * MiB, (7, 5), 68), ("mi300x", 192 * 1024 * MiB, (9, 4), None),
         ("mi250", 64 * 1024 * MiB, (9, 0), None)]


@pytest.mark.parametrize("name, capacity, cc, sms", ADDED, ids=[row[0] for row in ADDED])
def test_added_figures(name, capacity, cc, sms):
    spec = find_gpu(name)
    assert (spec.capacity_bytes, spec.compute_capability, spec.sm_count) == (capacity, cc, sms)


def test_sm_counts_agree_with_the_reduce_rule_table():
    """targets/cuda_reduce.py keeps its own SM table for the GPUs it knew; the catalog agrees with every one."""
    from trainmem.targets.cuda_reduce import SM_COUNTS

    assert {name: find_gpu(name).sm_count for name in SM_COUNTS} == SM_COUNTS


def test_a10_is_its_own_gpu():
    """"a10" named the A10G before; the A10 has 72 SMs to the A10G's 80, with the same 23028 MiB."""
    assert find_gpu("a10").marketing_name == "NVIDIA A10" and find_gpu("a10g").marketing_name == "NVIDIA A10G"
    assert (find_gpu("a10").sm_count, find_gpu("a10g").sm_count) == (72, 80)


@pytest.mark.parametrize("text", ["3060", "RTX 3060", "rtx-3060", "GeForce 3060", "3060 12gb"])
def test_search_finds_the_rtx_3060(text, capsys):
    code, out, err = run(["devices", "--search", text, "--format", "json"], capsys)
    names = [device["name"] for device in json.loads(out)]
    assert code == 0 and err == "" and "rtx3060-12gb" in names
    assert all("3060" in name for name in names)


def test_search_table_lists_only_the_matches(capsys):
    code, out, _ = run(["devices", "--search", "3060"], capsys)
    rows = out.split("\n\n")[0].splitlines()
    assert code == 0 and rows[0].startswith("name") and [row.split()[0] for row in rows[1:]] == ["rtx3060-12gb",
                                                                                                 "rtx3060ti"]
    assert "geerlingguy/raspberry-pi-pcie-devices/issues/790" in out


@pytest.mark.parametrize("text, expected", [("MI300X", ["mi300x"]), ("a100 80", ["a100-80gb"]),
                                            ("4060 ti", ["rtx4060ti-8gb", "rtx4060ti-16gb"]), ("cpu", ["cpu"]),
                                            ("instinct", ["mi250", "mi300x"]), ("h100", ["h100-80gb", "h100-pcie",
                                                                                          "h100-nvl"])])
def test_search_matches_keys_aliases_and_product_names(text, expected):
    assert [device.name for device in search_devices(text)] == expected


@pytest.mark.parametrize("text", ["tpu-v5", "zzz", " ", ""])
def test_a_search_without_a_match_is_one_line_exit_2(text, capsys):
    code, out, err = run(["devices", "--search", text], capsys)
    assert code == 2 and out == "" and err.count("\n") == 1
    assert err.startswith("trainmem: error: --search: expected")
    if text.strip():
        assert "no device matches" in err


def test_an_estimate_runs_on_the_rtx_3060(capsys):
    code, out, _ = run(["estimate", "mlp:1000-100-10", "--input-shape", "1000", "--batch-size", "8",
                        "--device", "rtx3060-12gb", "--format", "json"], capsys)
    result = json.loads(out)
    assert code == 0 and result["device"]["name"] == "rtx3060-12gb" and result["fits"] is True
    assert result["device"]["capacity_bytes"] == 12288 * MiB and result["device"]["capacity_from"] == "nvidia-smi"
    assert result["peak"]["process_bytes"] > result["peak"]["reserved_bytes"] >= result["peak"]["allocated_bytes"] > 0


@pytest.mark.parametrize("name", ["rtx2080ti", "p100", "rtx5070"])
def test_estimates_run_on_other_architectures(name, capsys):
    """Turing (cc 7.5: no bf16), Pascal (cc 6.0: no kernel images measured, said in the notes), RTX Blackwell."""
    code, out, _ = run(["estimate", "mlp:64-32-8", "--input-shape", "64", "--batch-size", "4", "--device", name,
                        "--format", "json"], capsys)
    assert code == 0 and json.loads(out)["device"]["name"] == find_gpu(name).name


@pytest.mark.parametrize("name", ["mi300x", "MI250", "instinct-mi300x"])
def test_an_amd_instinct_estimate_is_refused_on_one_line(name, capsys):
    code, out, err = run(["estimate", "mlp:64-32-8", "--input-shape", "64", "--batch-size", "4", "--device", name],
                         capsys)
    assert code == 2 and out == "" and err.count("\n") == 1
    assert err.startswith("trainmem: error: --device: expected a GPU the CUDA target models")
    assert "ROCm" in err and "does not model" in err


def test_amd_instinct_gpus_are_listed_for_their_capacity_only(capsys):
    code, out, _ = run(["devices", "--format", "json"], capsys)
    listed = {device["name"]: device for device in json.loads(out)}
    mi300x = listed["mi300x"]
    assert code == 0 and mi300x["kind"] == "rocm" and mi300x["gfx_target"] == "gfx942"
    assert mi300x["capacity_bytes"] == 192 * 1024**3 and mi300x["capacity_from"] == "datasheet"
    assert "cublas_workspace_bytes" not in mi300x and "cuda_context_bytes" not in mi300x
    assert "not modelled" in mi300x["estimates"] and listed["rtx3060-12gb"]["kind"] == "cuda"


def test_a_listed_rocm_device_object_is_refused_too():
    """The Python API takes a Device as well: one from all_devices() is refused the same way."""
    rocm = next(device for device in all_devices() if device.kind == PLATFORM_ROCM)
    with pytest.raises(SetupError, match="runs PyTorch on ROCm"):
        get_device(rocm)


def test_a_rocm_gpu_of_this_machine_is_refused(monkeypatch):
    """"cuda" on a ROCm build of torch names an AMD GPU: identified as one, and refused, never read as CUDA."""
    import trainmem.devices as devices

    monkeypatch.setattr(devices, "_visible_gpu",
                        lambda index: GpuProperties(index, "AMD Instinct MI300X", 205_822_885_888, (9, 4), "rocm"))
    with pytest.raises(SetupError, match="runs PyTorch on ROCm"):
        get_device("cuda")
    unknown = identify_gpu(GpuProperties(0, "AMD Instinct MI210", 68_702_699_520, (9, 0), "rocm"))
    assert unknown.platform == PLATFORM_ROCM and not unknown.modelled


def test_gpus_that_share_a_product_name_are_told_apart_by_their_memory():
    """An RTX 3080 is sold with 10 and 12 GB under one name: the entry nearest torch's total_memory is taken."""
    ten = identify_gpu(GpuProperties(0, "NVIDIA GeForce RTX 3080", 10_500_000_000, (8, 6)))
    twelve = identify_gpu(GpuProperties(0, "NVIDIA GeForce RTX 3080", 12_600_000_000, (8, 6)))
    assert (ten.name, ten.sm_count, twelve.name, twelve.sm_count) == ("rtx3080", 68, "rtx3080-12gb", 70)
    assert ten.capacity_from == twelve.capacity_from == CAPACITY_FROM_TORCH  # datasheet entries take the measurement
    sixteen = identify_gpu(GpuProperties(0, "NVIDIA GeForce RTX 4060 Ti", 17_175_150_592, (8, 9)))
    assert sixteen is find_gpu("rtx4060ti-16gb")


def test_a_memory_size_the_catalog_lacks_takes_the_measured_total():
    """An RTX 3060 8GB shares its name with the 12 GB entry; 12 GB would be a third too much."""
    spec = identify_gpu(GpuProperties(0, "NVIDIA GeForce RTX 3060", 8_589_410_304, (8, 6)))
    assert (spec.name, spec.capacity_bytes, spec.capacity_from) == ("rtx3060-12gb", 8_589_410_304, CAPACITY_FROM_TORCH)
    assert "12,884,901,888 B" in spec.capacity_source


def test_an_unknown_device_names_the_nearest_keys(capsys):
    code, _, err = run(["estimate", "mlp:10-3", "--device", "rtx4060ti"], capsys)
    assert code == 2 and "did you mean rtx4060ti-8gb or rtx4060ti-16gb?" in err and err.count("\n") == 1
    assert len(err) < 400  # the catalog's 58 names are not all listed


def test_the_catalog_has_the_gpus_of_the_issue_and_no_duplicates():
    assert len(CATALOG) == 58
    assert len({spec.marketing_name for spec in CATALOG}) == len(CATALOG) - 2  # RTX 3080 and RTX 4060 Ti share
