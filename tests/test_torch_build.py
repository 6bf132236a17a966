"""Per-build facts under a torch without a measurement of its own: the nearest measured build's are used,
and the estimate says which (targets/torch_build.py, targets/cpu_runtime.py)."""

from collections import Counter

import pytest
import torch

from trainmem.targets import cpu_runtime
from trainmem.targets.torch_build import CPU, CUDA, ROCM, TorchBuild, nearest

ENTRIES = [{"torch": "2.13.0+cpu", "floor": 1}, {"torch": "2.14.1+cu130", "floor": 2},
           {"torch": "2.10.0+cu128", "floor": 3}, {"torch": "2.12.0+cpu", "floor": 4}]


@pytest.mark.parametrize("version,kind,expected", [
    ("2.13.0+cpu", None, "2.13.0+cpu"),  # its own
    ("2.14.1+cu130", None, "2.14.1+cu130"),
    ("2.15.0+cu132", None, "2.14.1+cu130"),  # same kind, closest release
    ("2.6.0+cu124", None, "2.10.0+cu128"),
    ("2.11.0+cu128", None, "2.10.0+cu128"),  # 2.10 and 2.14.1: 2.10 is closer
    ("2.14.0+cpu", None, "2.13.0+cpu"),  # a CPU build takes a CPU entry, however close a CUDA one is
    ("2.14.1", CPU, "2.13.0+cpu"),  # no label: the kind comes from what the build was made with
    ("2.14.1", CUDA, "2.14.1+cu130"),
    ("2.12.1+cpu", None, "2.12.0+cpu"),  # a patch away beats a minor release away
])
def test_nearest_measured_build(version, kind, expected):
    choice = nearest(ENTRIES, TorchBuild.parse(version, kind))
    assert choice.measured_on == expected
    assert choice.exact == (version == expected)


def test_equally_close_releases_take_the_newer():
    entries = [{"torch": "2.10.0+cu128"}, {"torch": "2.14.0+cu130"}]
    assert nearest(entries, TorchBuild.parse("2.12.0+cu129")).measured_on == "2.14.0+cu130"


def test_warning_names_both_builds_only_when_borrowed():
    borrowed = nearest(ENTRIES, TorchBuild.parse("2.15.0+cu132"))
    warning = borrowed.warning("process floor")
    assert "torch 2.15.0+cu132" in warning and "torch 2.14.1+cu130" in warning
    assert warning.startswith("process floor")  # tests/test_golden.py sets these lines aside as machine-bound
    assert nearest(ENTRIES, TorchBuild.parse("2.13.0+cpu")).warning("process floor") is None


def test_running_build_kind_matches_this_torch():
    running = TorchBuild.running()
    assert running.text == torch.__version__
    assert running.kind == (CUDA if torch.version.cuda else ROCM if torch.version.hip else CPU)
    assert running.release[:2] == tuple(int(part) for part in torch.__version__.split(".")[:2])


def test_process_floor_of_an_unmeasured_build_is_the_nearest_and_warned(monkeypatch):
    """The shipped calibration table: a CUDA build newer than any measured takes the newest CUDA entry's
    floor, and the floor's assumptions say whose it is."""
    calibrations = {entry["torch"]: entry for entry in cpu_runtime.json.loads(cpu_runtime.DATA.read_text())["calibrations"]}
    cuda_entries = sorted((TorchBuild.parse(name).release, name) for name in calibrations
                          if TorchBuild.parse(name).kind == CUDA)
    newest_cuda = cuda_entries[-1][1]
    future = "99.0.0+cu990"
    monkeypatch.setattr(TorchBuild, "running", classmethod(lambda cls: cls.parse(future)))
    floor = cpu_runtime.runtime_floor(Counter())
    assert floor.parts["process_floor"] == calibrations[newest_cuda]["floor_bytes"]
    assert any(future in line and newest_cuda in line for line in floor.assumptions)


def test_process_floor_of_a_measured_build_has_no_borrowed_warning():
    running = TorchBuild.running()
    table = [entry["torch"] for entry in cpu_runtime.json.loads(cpu_runtime.DATA.read_text())["calibrations"]]
    floor = cpu_runtime.runtime_floor(Counter())
    borrowed = [line for line in floor.assumptions if "no measurement for torch" in line]
    assert bool(borrowed) == (running.text not in table)


AMD = {"torch": "2.13.0+cpu", "machine": "x86_64", "cpu": "AMD EPYC", "floor_bytes": 1,
       "libraries": {"transformers": 50}, "import_sets": {"transformers": 50}}
INTEL = {"torch": "2.13.0+cpu", "machine": "x86_64", "cpu": "Intel Xeon", "floor_bytes": 2,
         "libraries": {"transformers": 60, "lightning": 70}, "import_sets": {"lightning": 70}}
CUDA_BUILD = {"torch": "2.14.1+cu130", "machine": "x86_64", "cpu": "AMD EPYC", "floor_bytes": 3,
              "libraries": {"lightning": 90, "timm": 30}, "import_sets": {"lightning": 90, "timm": 30}}


def test_a_library_set_the_chosen_machine_lacks_is_taken_from_another_and_said():
    """A set measured on one bundled machine only must not count 0 B on the others (never low): the same build's
    measurement elsewhere first, said in the assumptions; the chosen machine's own figures stay its own."""
    bundled = [AMD, INTEL, CUDA_BUILD]
    parts, said = cpu_runtime._library_parts(frozenset({"lightning"}), AMD, bundled)
    assert parts == {"libraries_lightning": 70} and "Intel Xeon" in said[0] and "2.13.0+cpu" in said[0]
    assert cpu_runtime._library_parts(frozenset({"transformers"}), AMD, bundled) == ({"libraries_transformers": 50}, [])
    parts, said = cpu_runtime._library_parts(frozenset({"timm"}), AMD, bundled)  # only another build measured it
    assert parts == {"libraries_timm": 30} and "2.14.1+cu130" in said[0]


def test_a_set_measured_nowhere_adds_each_library_from_wherever_it_was_measured():
    bundled = [AMD, INTEL, CUDA_BUILD]
    parts, said = cpu_runtime._library_parts(frozenset({"transformers", "lightning", "nowhere"}), AMD, bundled)
    assert parts == {"library_transformers": 50, "library_lightning": 70}
    assert "not calibrated together" in said[0] and "no increment measured for nowhere" in said[0]
    assert any("what lightning maps" in line and "Intel Xeon" in line for line in said[1:])
