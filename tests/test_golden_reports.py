"""Golden snapshots of what `trainmem estimate` prints, through the CLI in-process: the text report, the --quiet
line and --format json, for a few fixed setups. A layout or figure that changes shows up here as a diff.

Rewrite them on purpose only (then read the diff before committing it):

    TRAINMEM_UPDATE_GOLDENS=1 python -m pytest tests/test_golden_reports.py

What varies by machine, and how each golden copes:
- GPU targets (a100-40gb, a custom GPU) are machine-independent: the device comes from the catalog, the CUDA
  version is given (--cuda-version 12.8, else it is read from the installed torch), the model is a config file
  given by a path relative to the repository (the test runs from there). Their goldens are whole; only the JSON's
  trainmem_version is dropped.
- The CPU target reads this machine: its capacity (MemTotal), the process floor measured for the installed torch
  build, and the CPU's capability and thread count (targets/cpu_info.py CpuInfo, which sizes oneDNN's scratch).
  The test pins CpuInfo to the machine the goldens were made on (AVX512, 2 threads) so the tensor figures do not
  move; the process figures (peak RSS, capacity, fits) are replaced by a marker in the text and dropped from the
  JSON, and the --quiet line is checked against the same run's JSON instead.
All goldens depend on the installed torch and transformers (their ops are what is traced): a version bump that
changes them is a real change to review, not noise. golden/VERSIONS names the two they were written under (the dev
environment's pins); under any other pair (`make compat` runs these tests on torch 2.6 … 2.15) the comparison is
skipped with both named: traced op counts, the process floor of a CUDA build and torch's own pipeline buffers
differ there by design, and benchmarks/compat.py compares the estimates across torches instead.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from trainmem.cli import main
from trainmem.targets.cpu_info import CpuInfo
from trainmem.units import format_bytes

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "golden"
UPDATE = bool(os.environ.get("TRAINMEM_UPDATE_GOLDENS"))

LLAMA = ["estimate", "hf:tests/data/tiny_llama", "--batch-size", "4", "--seq-len", "64", "--cuda-version", "12.8"]
CASES = {
    # the seed MLP of the README, on this machine's CPU
    "cpu_mlp": (["estimate", "mlp:1000-100-100-100-100-10", "--input-shape", "1000", "--batch-size", "256",
                 "--optimizer", "adam"], 0),
    # a small Llama (2 layers, hidden 128) on an A100 40GB
    "a100_tiny_llama": (LLAMA + ["--device", "a100-40gb"], 0),
    # the same on a 30 MiB GPU: the simulated allocator runs out of memory (a warning), exit 1
    "oom_tiny_llama": (LLAMA + ["--device", "custom:capacity=30MiB,cc=8.0"], 1),
    # two pipeline stages: the most loaded rank's figures, per rank
    "pp2_tiny_llama": (LLAMA + ["--device", "a100-40gb", "--pp", "2"], 0),
}
FORMATS = {"text": ([], "txt"), "quiet": (["--quiet"], "quiet.txt"), "json": (["--format", "json"], "json")}
# which formats each case keeps a golden of (the pp and oom cases: the text and the one line, not the JSON
# again: their JSON is the a100 case's schema with other numbers, and each run costs seconds)
KEPT = {"cpu_mlp": ("text", "quiet", "json"), "a100_tiny_llama": ("text", "quiet", "json"),
        "oom_tiny_llama": ("text", "quiet"), "pp2_tiny_llama": ("text", "quiet")}

# CPU text lines whose figures are this machine's (capacity, process floor, peak RSS built on it)
MACHINE_LINES = ("  process (peak RSS)", "  process, high end", "  process_floor", "  runtime_", "  tensor_heap_resident",
                 "  - process floor", "  - this process runs", "  - where the objects fall", "  - peak RSS replays",
                 "  - peak RSS is the run's")
QUIET = re.compile(r"^peak (?P<peak>\S+ \S+)(?P<rank> per rank)? \((?:most loaded: [^;]+; )?"
                   r"(?:fits (?P<device>.+?), (?P<free>\S+ \S+) free|does not fit (?P<ndevice>.+?): (?P<why>.+))\)"
                   r"(?:; high end (?P<high>\S+ \S+))?$")


@pytest.fixture(autouse=True)
def _fixed_place(monkeypatch):
    """Run from the repository (the model paths are relative to it) with the goldens' CPU facts."""
    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(CpuInfo, "this_machine", classmethod(lambda cls: cls("AVX512", 2, avx512_bf16=True)))


def _run(case: str, fmt: str, capsys) -> str:
    args, code = CASES[case]
    capsys.readouterr()
    assert main(args + FORMATS[fmt][0]) == code
    out = capsys.readouterr().out
    assert "\x1b" not in out  # a capture is not a terminal: no colour
    return out


def _versions() -> str:
    import torch
    import transformers

    return f"torch {torch.__version__}\ntransformers {transformers.__version__}\n"


def _skip_unless_written_under_these_versions() -> None:
    written = (GOLDEN / "VERSIONS").read_text()
    if not UPDATE and written != _versions():
        pytest.skip(f"goldens written under {written.strip()}; this is {_versions().strip()}".replace("\n", ", "))


def _normalised(case: str, fmt: str, out: str) -> str:
    if fmt == "json":
        data = json.loads(out)
        data.pop("trainmem_version")
        if case.startswith("cpu"):
            data = _stable_cpu_json(data)
        return json.dumps(data, indent=2, sort_keys=True) + "\n"
    if case.startswith("cpu") and fmt == "text":
        out = "\n".join(line[:len(p)] + " <this machine>" if (p := _machine_prefix(line)) else line
                        for line in out.splitlines()) + "\n"
    if case.startswith("cpu") and fmt == "quiet":
        out = re.sub(r"\d[\d.,]* (B|KiB|MiB|GiB|TiB)", "<size>", out)
    return out


def _machine_prefix(line: str) -> str | None:
    return next((p for p in MACHINE_LINES if line.startswith(p)), None)


def _stable_cpu_json(data: dict) -> dict:
    """The CPU JSON without this machine's figures: capacity, the process (peak RSS on the floor measured for
    this torch build), whether it fits, and the warnings that quote them."""
    data["device"] = {"name": data["device"]["name"], "kind": data["device"]["kind"]}
    for key in ("process_bytes", "process_bytes_high"):
        data["peak"].pop(key)
    for key in ("process", "fits", "warnings"):
        data.pop(key)
    return data


@pytest.mark.heavy
@pytest.mark.parametrize(("case", "fmt"), [(c, f) for c, kept in KEPT.items() for f in kept])
def test_report_matches_golden(case, fmt, capsys):
    _skip_unless_written_under_these_versions()
    text = _normalised(case, fmt, _run(case, fmt, capsys))
    path = GOLDEN / f"{case}.{FORMATS[fmt][1]}"
    if UPDATE:
        path.write_text(text)
        (GOLDEN / "VERSIONS").write_text(_versions())
    assert path.exists(), f"no golden {path.name}: make it with TRAINMEM_UPDATE_GOLDENS=1 and review it"
    assert text == path.read_text(), f"{path.name} changed; if on purpose, rewrite with TRAINMEM_UPDATE_GOLDENS=1"


@pytest.mark.heavy
@pytest.mark.parametrize("case", ["cpu_mlp", "oom_tiny_llama"])
def test_quiet_line_agrees_with_the_json(case, capsys):
    """The one line states the JSON's process figure, its verdict and the headroom (or excess), whatever the
    machine: the check behind the CPU quiet golden, whose sizes are normalised away."""
    line = _run(case, "quiet", capsys).strip()
    data = json.loads(_run(case, "json", capsys))
    found = QUIET.match(line)
    assert found, line
    peak, capacity = data["peak"]["process_bytes"], data["device"]["capacity_bytes"]
    assert found["peak"] == format_bytes(peak)
    assert (found["free"] is not None) == data["fits"]
    if data["fits"]:
        assert found["free"] == format_bytes(capacity - peak)
    elif peak > capacity:
        assert found["why"] == f"{format_bytes(peak - capacity)} over"
    high = data["peak"]["process_bytes_high"]
    assert found["high"] == (format_bytes(high) if high > peak else None)
    words = "cpu RAM" if data["device"]["kind"] == "cpu" else data["device"]["name"]
    assert (found["device"] or found["ndevice"]) == words
