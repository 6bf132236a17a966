"""What a CPU training process holds besides its tensors: the process floor.

The floor is the peak RSS of a fresh Python process that imports torch and trains a tiny model for two
steps (the interpreter, torch's libraries as mapped, thread pools, autograd and optimizer machinery),
less that tiny model's own tensors. It is measured, not derived: `benchmarks/calibrate_cpu.py` writes
`targets/data/cpu_runtime.json` with the torch version, CPU capability and thread count it was
measured with, one entry per torch build; a build without its own entry takes the nearest measured one,
and the estimate says which (targets/torch_build.py). Kernel families that load more code or JIT buffers (oneDNN convolution, LSTM) add a
measured increment of their own.
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from pathlib import Path

from trainmem.targets.calibrations import MachineChoice, choose_machine, machine_spread
from trainmem.targets.cpu_info import CpuInfo
from trainmem.targets.torch_build import FactChoice, TorchBuild, nearest

DATA = Path(__file__).parent / "data" / "cpu_runtime.json"

# op families whose first use maps more library code or JIT buffers; names as the dispatcher sees them
FAMILIES = {
    "convolution": ("convolution", "convolution_backward"),
    "lstm": ("mkldnn_rnn_layer", "mkldnn_rnn_layer_backward"),
    "attention": ("_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention_for_cpu_backward"),
}


@dataclasses.dataclass(frozen=True)
class RuntimeFloor:
    parts: dict[str, int]
    assumptions: list[str]
    spread: int = 0  # bytes the high end allows for the machine: 0 when calibrated on this one
    # --compile: what compiling held at its peak beyond runtime_compile and gave back; the point counts what of it
    # the tensors' heap does not cover, the high end all of it (targets/cpu_target.py)
    compile_transient: int = 0


def choose(running: TorchBuild | None = None) -> FactChoice:
    """The calibration measured with the running torch build, else the nearest measured one (the CPU build
    and the CUDA build of one release differ by hundreds of MiB: the CUDA one maps its libraries at import),
    with the warning that says so (targets/torch_build.py)."""
    calibrations = json.loads(DATA.read_text())["calibrations"]
    return nearest(calibrations, running or TorchBuild.running())


def choose_for(cpu: CpuInfo, running: TorchBuild | None = None) -> tuple[FactChoice, MachineChoice]:
    """The torch build's calibration (`choose`), then among that build's entries the one of this machine
    (`trainmem calibrate`) or of the most similar bundled CPU (targets/calibrations.py)."""
    running = running or TorchBuild.running()
    build = choose(running)
    bundled = json.loads(DATA.read_text())["calibrations"]
    entries = [entry for entry in bundled if entry["torch"] == build.measured_on]
    machine = choose_machine(entries, cpu, running.text, machine_spread(bundled))
    if machine.own:  # this machine's own measurement of the running build: exact
        build = FactChoice(machine.entry, running.text, running.text, True)
    else:
        build = dataclasses.replace(build, entry=machine.entry)
    return build, machine


def load() -> dict:
    """The calibration `choose_for` picks for the running torch on this machine."""
    return choose_for(CpuInfo.this_machine())[0].entry


def _add_compile(parts: dict[str, int], data: dict) -> tuple[list[str], int]:
    """runtime_compile, what torch.compile keeps in the process (dynamo, Inductor, their caches, the compiled code:
    calibrate.compile_increment), and what compiling held beyond it at its peak: this calibration's, else those of
    the bundled calibration that measured the most (never low); with the assumption said, if any."""
    said = []
    if "compile" not in data.get("families", {}):
        measured = [entry for entry in json.loads(DATA.read_text())["calibrations"]
                    if "compile" in entry.get("families", {})]
        if not measured:
            return ["what torch.compile adds to the process (dynamo, Inductor, their caches) was not measured for any "
                    "calibration: not counted"], 0
        data = max(measured, key=lambda entry: entry["families"]["compile"] + entry["families"].get("compile_transient", 0))
        said = [f"what torch.compile adds to the process was measured with torch {data['torch']} on "
                f"{data.get('cpu') or data['machine']}, not with this calibration's build"]
    parts["runtime_compile"] = int(data["families"]["compile"])
    return said, int(data["families"].get("compile_transient", 0))


def import_set_key(libraries) -> str:
    """The calibration key of a set of imported libraries: their names, sorted, joined by '+'."""
    return "+".join(sorted(libraries))


def _library_parts(libraries: frozenset[str], data: dict, bundled: list[dict]) -> tuple[dict[str, int], list[str]]:
    """What the set of `libraries` maps into the process: the chosen calibration's measurement of the set, else the
    set as another bundled calibration measured it, else each library's own increment (from this calibration, else
    another's), with the assumption said. A set measured on one machine only (lightning: on the Intel Xeon) would
    otherwise count 0 B on every other machine; library pages are the libraries' files as mapped, which move little
    between CPUs, so another machine's figure is taken (the largest, never low) and the report says whose it is."""
    key = import_set_key(libraries)
    others = [entry for entry in bundled if entry != data]

    def measured(section: str, name: str) -> tuple[int, dict] | None:
        if name in data.get(section, {}):
            return int(data[section][name]), data
        holding = [entry for entry in others if name in entry.get(section, {})]
        found = [entry for entry in holding if entry["torch"] == data["torch"]] or holding  # the same build first
        if not found:
            return None
        entry = max(found, key=lambda entry: entry[section][name])
        return int(entry[section][name]), entry

    def elsewhere(entry: dict, what: str) -> list[str]:
        return [] if entry is data else [f"{what} was measured with torch {entry['torch']} on "
                                         f"{entry.get('cpu') or entry['machine']}, not with this calibration"]
    whole = measured("import_sets", key)
    if whole is not None:
        return {f"libraries_{key}": whole[0]}, elsewhere(whole[1], f"what {', '.join(sorted(libraries))} map")
    parts, said, missing = {}, [], []
    for library in sorted(libraries):
        one = measured("libraries", library)
        if one is None:
            missing.append(library)
            continue
        parts[f"library_{library}"] = one[0]
        said += elsewhere(one[1], f"what {library} maps")
    said.insert(0, f"the libraries {', '.join(sorted(libraries))} were not calibrated together: their separate "
                   "increments are added, which counts what they share twice"
                + (f"; no increment measured for {', '.join(missing)}" if missing else ""))
    return parts, said


def runtime_floor(op_counts: Counter, libraries: frozenset[str] = frozenset(),
                  cpu: CpuInfo | None = None, compiled: bool = False) -> RuntimeFloor:
    """The floor, the kernel families the trace used, and the libraries the model reference brings
    into the process (transformers for hf:, peft and transformers for --lora, torchvision and timm for
    their references), each as measured by calibrate_cpu.py.

    Libraries share what they import (peft imports transformers, transformers imports torchvision when
    it is installed, timm and transformers share huggingface_hub), so the increments of two libraries
    do not add up: `import torch, torchvision` maps 164 MiB more than `import torch`, `import torch,
    peft` 214 MiB, both together also 214 MiB (torch 2.14.1, this project's vision environment). The
    calibration therefore measures each set of libraries a reference can bring as one increment; the
    per-library sum is a fallback for a set it did not measure, and the report says so.

    `cpu` (default: this machine) is compared with the calibration's capability and thread count: a floor measured
    with other ones is reported as an assumption. `compiled` (--compile) adds torch.compile's (_add_compile)."""
    import torch

    cpu = cpu or CpuInfo.this_machine()
    choice, machine = choose_for(cpu)
    data = choice.entry
    parts = {"process_floor": int(data["floor_bytes"])}
    for family, ops in FAMILIES.items():
        if any(op_counts.get(op) for op in ops) and family in data.get("families", {}):
            parts[f"runtime_{family}"] = int(data["families"][family])
    assumptions, transient = _add_compile(parts, data) if compiled else ([], 0)
    assumptions += [f"process floor {data['floor_bytes'] / 2**20:.0f} MiB measured on {data['machine']} (torch "
                    f"{data['torch']}, {data['capability']}, {data['threads']} threads): interpreter, torch libraries, thread pools", machine.said]
    if choice.warning("process floor"):
        assumptions.append(choice.warning("process floor"))
    if libraries:
        library_parts, said = _library_parts(libraries, data, json.loads(DATA.read_text())["calibrations"])
        parts.update(library_parts)
        assumptions += said
    here = (torch.__version__, cpu.capability, cpu.threads)
    if here != (data["torch"], data["capability"], data["threads"]):
        assumptions.append(f"this process runs torch {here[0]}, {here[1]}, {here[2]} threads: the process floor "
                           "was measured elsewhere and may differ by tens of MiB")
    return RuntimeFloor(parts, assumptions, machine.spread, transient)
